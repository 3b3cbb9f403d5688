"""`crucible images …`: build the sandbox images (debootstrap base + environment Dockerfiles).

    crucible images build              # base + every environments/images/<name>/Dockerfile; no-op if unchanged
    crucible images build code-repo --force
    crucible images ls -o json
    crucible images openenv echo dipg  # OpenEnv environments from PyPI (environments/openenv/images.py)
    crucible images agent mini-swe-agent   # an agent program from PyPI on the code-repo image (agent_program)
    crucible images push               # to CRUCIBLE_IMAGE_REGISTRY, for worker hosts (environments/images/registry.py)
"""

from __future__ import annotations

import typer
from rich.table import Table

from cli.console import OutputFormat, OutputOption, console, print_json, readable_errors

app = typer.Typer(help="Sandbox images: build (content-hash tagged), list, and push to a registry.",
                  no_args_is_help=True)


@app.command()
def build(
    names: list[str] = typer.Argument(None, help="environment images to build (default: all)"),
    force: bool = typer.Option(False, "--force", help="rebuild even if the tag exists"),
    output: OutputFormat = OutputOption,
) -> None:
    """Build the base image and environment images; unchanged inputs are a no-op."""
    from environments.images import build_images

    with readable_errors():
        built = build_images(names=names or None, force=force)
    if output is OutputFormat.json:
        print_json([b.as_dict() for b in built])
        return
    table = Table("IMAGE", "TAG", "BUILT", "SECONDS")
    for b in built:
        table.add_row(b.name, b.tag, "yes" if b.built else "unchanged", f"{b.seconds:.1f}")
    console.print(table)


@app.command("ls")
def list_(output: OutputFormat = OutputOption) -> None:
    """Current tag of each image and whether it is built."""
    from core.settings import get_settings
    from environments.images import environment_names, image_tag
    from sandboxes.docker_client import docker_api

    with readable_errors():
        base = get_settings().sandbox_base_image
        api = docker_api()
        rows = []
        for name in ["base", *environment_names()]:
            tag = image_tag(name, base_image=base)
            rows.append({"name": name, "tag": tag, "built": bool(api.images(name=tag))})
    if output is OutputFormat.json:
        print_json(rows)
        return
    table = Table("IMAGE", "TAG", "BUILT")
    for r in rows:
        table.add_row(str(r["name"]), str(r["tag"]), "yes" if r["built"] else "no")
    console.print(table)


@app.command()
def push(
    images: list[str] = typer.Argument(None, help="images to push, as repository:tag (default: every crucible, "
                                       "crucible-factory and crucible-openenv image this host holds)"),
    registry: str = typer.Option(None, "--registry", help="host:port[/path] (default: CRUCIBLE_IMAGE_REGISTRY)"),
    output: OutputFormat = OutputOption,
) -> None:
    """Push sandbox images to a registry and record each one's digest, so that a worker host that lacks an
    image pulls it by digest when it first needs it."""
    from core.errors import ConfigError
    from environments.images.registry import local_images, push_images, registry_of

    with readable_errors():
        target = registry_of(registry)
        chosen = list(images or []) or local_images()
        if not chosen:
            raise ConfigError("expected images to push, got none on this host (build them: `crucible images build`)")
        pushed = push_images(chosen, registry=target)
    if output is OutputFormat.json:
        print_json([p.as_dict() for p in pushed])
        return
    table = Table("IMAGE", "PULLED AS")
    for p in pushed:
        table.add_row(p.image, p.reference)
    console.print(table)


@app.command()
def openenv(
    names: list[str] = typer.Argument(..., help="recipes to build (echo, dipg), or with --app the image's name"),
    app_: str = typer.Option(None, "--app", help="module:attribute of the ASGI app of your own OpenEnv environment"),
    requirements: list[str] = typer.Option(None, "--requirement", "-r",
                                           help="PEP 508 requirement of your environment (with --app; repeatable)"),
    output: OutputFormat = OutputOption,
) -> None:
    """Build OpenEnv environment images: an environment from PyPI installed into the base image, with the bridge
    the `openenv` kind talks to. Prints each image's tag (also tagged :latest)."""
    from core.errors import ConfigError
    from environments.code_repo.factory.requirements import check_requirements
    from environments.images import build_images
    from environments.openenv.images import OPENENV_CORE, RECIPES, Recipe, openenv_image

    with readable_errors():
        if app_ is not None:
            if names and names[0] in RECIPES:
                raise ConfigError(f"--app: expected a name of your own for the image, got the recipe {names[0]!r} "
                                  f"(its :latest tag would then name your environment)")
            if len(names) != 1 or not requirements:
                raise ConfigError(f"--app: expected one image name and at least one --requirement, got names "
                                  f"{names} and requirements {requirements or []}")
            from pydantic import ValidationError

            from environments.openenv.config import OpenEnvSettings

            try:
                OpenEnvSettings(app=app_)  # the spec's own check of the app's spelling
            except ValidationError:
                raise ConfigError(f"--app: expected module:attribute (a Python module path, a colon, a name), got "
                                  f"{app_[:200]!r}") from None
            checked = check_requirements(requirements, where="--requirement")
            recipes = {names[0]: Recipe(requirements=(*checked, OPENENV_CORE), app=app_)}
        else:
            unknown = [name for name in names if name not in RECIPES]
            if unknown:
                raise ConfigError(f"recipe: expected one of {', '.join(RECIPES)} (or --app with --requirement), got "
                                  f"{', '.join(unknown)}")
            recipes = {name: RECIPES[name] for name in names}
        base = build_images(names=[])[0].tag
        rows = [{"name": name, "tag": openenv_image(name, recipe, base_tag=base), "app": recipe.app,
                 "env": recipe.env} for name, recipe in recipes.items()]
    if output is OutputFormat.json:
        print_json(rows)
        return
    table = Table("IMAGE", "TAG", "APP")
    for row in rows:
        table.add_row(str(row["name"]), str(row["tag"]), str(row["app"]))
    console.print(table)


@app.command()
def agent(
    names: list[str] = typer.Argument(..., help="agent programs to build (mini-swe-agent)"),
    output: OutputFormat = OutputOption,
) -> None:
    """Build agent-program images: a program from PyPI installed into the code-repo image, for an agent_program
    environment's `image`. Prints each tag (also tagged :latest) and the `agent_program` section that runs it."""
    from core.errors import ConfigError
    from environments.agent_program.images import PROGRAMS, program_image
    from environments.images import build_images

    with readable_errors():
        unknown = [name for name in names if name not in PROGRAMS]
        if unknown:
            raise ConfigError(f"program: expected one of {', '.join(PROGRAMS)}, got {', '.join(unknown)[:300]}")
        base = next(image.tag for image in build_images(names=["code-repo"]) if image.name == "code-repo")
        rows = [{"name": name, "tag": program_image(name, base_tag=base), "agent_program": PROGRAMS[name].section}
                for name in names]
    if output is OutputFormat.json:
        print_json(rows)
        return
    table = Table("PROGRAM", "TAG")
    for row in rows:
        table.add_row(str(row["name"]), str(row["tag"]))
    console.print(table)
