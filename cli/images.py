"""`crucible images …`: build the sandbox images (debootstrap base + environment Dockerfiles).

    crucible images build              # base + every environments/images/<name>/Dockerfile; no-op if unchanged
    crucible images build code-repo --force
    crucible images ls -o json
"""

from __future__ import annotations

import typer
from rich.table import Table

from cli.console import OutputFormat, OutputOption, console, print_json, readable_errors

app = typer.Typer(help="Sandbox images: build (content-hash tagged) and list.", no_args_is_help=True)


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
