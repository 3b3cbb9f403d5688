"""`crucible sandbox …`: list, create, inspect, exec into, copy to/from and remove sandboxes.

IDs are our sandbox ids (`sb-1a2b3c4d5e`) or a container-id prefix. Every verb takes `-o json`.

    crucible sandbox create --image crucible/code-repo:latest --seed /opt/seed
    crucible sandbox exec sb-1a2b3c4d5e -- python3 -m pytest -q
    crucible sandbox rm --all --older-than 2h --dry-run
    crucible sandbox browser --miniwob click-button --seed 3 --screenshot page.png

With `--api`, `ls`, `exec` and `cp` reach the sandboxes of every worker host through the API and the worker
that holds each (task_workers/control.py), with CRUCIBLE_API_URL and CRUCIBLE_API_TOKEN: only sandboxes
leased to a run, by their exact sandbox id.

    crucible sandbox ls --api --run 3
    crucible sandbox exec --api sb-1a2b3c4d5e -- pytest -q
    crucible sandbox cp --api sb-1a2b3c4d5e:/workspace/calc.py ./calc.py
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import typer
from rich.live import Live
from rich.table import Table

from cli import sandbox_browser
from cli.console import OutputFormat, OutputOption, console, print_json, readable_errors
from core.tar import extract_to, pack_path
from sandboxes import admin
from sandboxes import labels as L
from sandboxes.backend import SandboxBackend, make_backend
from sandboxes.create import is_sandbox_id
from sandboxes.errors import SandboxError
from sandboxes.sandbox import Sandbox
from sandboxes.shell import StepStatus
from sandboxes.spec import SandboxSpec

app = typer.Typer(help="Docker sandboxes: list, create, exec, copy, inspect, remove.", no_args_is_help=True)


app.command()(sandbox_browser.browser)  # `sandbox browser`: its options and checks live in cli/sandbox_browser.py


def _backend() -> SandboxBackend:
    return make_backend("docker")


def _open(ref: str) -> Sandbox:
    backend = _backend()
    return admin.attach(backend, admin.find_sandbox(backend, ref))


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _table(rows: list[admin.SandboxRow]) -> Table:
    table = Table("SANDBOX", "CONTAINER", "IMAGE", "STATE", "RUN", "EPISODE", "ENV", "AGE", "LEASE", "OWNER")
    for r in rows:
        table.add_row(r.sandbox_id, r.container_id, r.image, r.state, r.run, r.episode, r.env,
                      _age(r.age_s), _age(r.lease_left_s), r.owner)
    return table


@app.command("ls")
def list_(
    run: str = typer.Option(None, "--run", help="only this run id"),
    env: str = typer.Option(None, "--env", help="only this environment"),
    state: str = typer.Option(None, "--state", help="running, exited, created…"),
    older_than: str = typer.Option(None, "--older-than", help="only older than e.g. 10m, 2h"),
    watch: bool = typer.Option(False, "--watch", "-w", help="refresh until Ctrl-C"),
    interval: float = typer.Option(2.0, "--interval", help="seconds between refreshes with --watch"),
    via_api: bool = typer.Option(False, "--api", help="every worker host's sandboxes leased to a run, through the API"),
    output: OutputFormat = OutputOption,
) -> None:
    """List sandboxes."""
    if via_api:
        _list_through_api(run=run, output=output)
        return
    with readable_errors():
        backend = _backend()
        older = admin.parse_duration(older_than) if older_than else None

        def rows() -> list[admin.SandboxRow]:
            # Run and episode are read from each sandbox's lease (its labels predate any lease).
            leases = admin.read_leases(backend, backend.list(labels=L.label_filter(env=env) or None))
            infos = admin.list_sandboxes(backend, run=run, env=env, state=state, older_than_s=older, leases=leases)
            return [admin.row(i, leases.get(i.id)) for i in infos]

        if output is OutputFormat.json:
            print_json([r.as_dict() for r in rows()])
        elif not watch:
            console.print(_table(rows()))
        else:
            with Live(_table(rows()), console=console, refresh_per_second=4) as live:
                while True:
                    time.sleep(interval)
                    live.update(_table(rows()))


def _list_through_api(*, run: str | None, output: OutputFormat) -> None:
    from cli.api_client import api_client

    with readable_errors():
        if run is not None and not run.isdigit():
            raise SandboxError(f"--run: expected a run id (a number) with --api, got {run[:40]!r}")
        listed = api_client().get("/v1/sandboxes", params={"run_id": run})
    if output is OutputFormat.json:
        print_json(listed)
        return
    table = Table("SANDBOX", "WORKER", "IMAGE", "STATE", "RUN", "EPISODE", "ENV", "AGE", "LEASE")
    for r in listed["data"]:
        table.add_row(r["sandbox_id"], r["worker"], r["image"], r["state"], r["run"], r["episode"], r["env"],
                      _age(r["age_s"]), _age(r["lease_left_s"]))
    console.print(table)
    for worker, why in listed["unreachable"].items():
        console.print(f"[yellow]worker {worker} did not answer: {why}[/]", highlight=False)


@app.command()
def create(
    image: str = typer.Option(None, "--image", help="image tag (default: the current crucible/base)"),
    cpus: float = typer.Option(1.0, "--cpus"),
    memory: str = typer.Option("2g", "--memory"),
    pids: int = typer.Option(512, "--pids"),
    workspace_size: str = typer.Option("1g", "--workspace-size"),
    seed: str = typer.Option(None, "--seed", help="directory in the image copied into the workspace"),
    timeout: float = typer.Option(60.0, "--timeout", help="default command timeout (s)"),
    ttl: str = typer.Option("1h", "--ttl", help="lifetime; the container ends itself after it"),
    env_name: str = typer.Option(None, "--env-name", help="environment label (for ls --env)"),
    env: list[str] = typer.Option([], "--env", "-e", help="NAME=value, repeatable"),
    output: OutputFormat = OutputOption,
) -> None:
    """Create a sandbox that lives until its --ttl or `crucible sandbox rm`."""
    with readable_errors():
        if image is None:
            from core.settings import get_settings
            from environments.images import image_tag

            image = image_tag("base", base_image=get_settings().sandbox_base_image)
        spec = SandboxSpec(
            image=image, cpus=cpus, memory=memory, pids=pids, workspace_size=workspace_size,
            workspace_seed=seed, command_timeout_s=timeout, max_lifetime_s=int(admin.parse_duration(ttl)),
            env=list(env),
        )
        sandbox = admin.create_detached(_backend(), spec=spec, env_name=env_name)
        sandbox.close_session()
        data = {"sandbox_id": sandbox.id, "container_id": sandbox.container_id, "image": image}
        print_json(data) if output is OutputFormat.json else console.print(f"{sandbox.id} {sandbox.container_id[:12]}")


@app.command()
def info(ref: str, output: OutputFormat = OutputOption) -> None:
    """Show one sandbox: labels, spec, lease."""
    with readable_errors():
        backend = _backend()
        container = admin.find_sandbox(backend, ref)
        data = admin.describe(admin.attach(backend, container), container)
        if output is OutputFormat.json:
            print_json(data)
            return
        table = Table("FIELD", "VALUE", show_header=False)
        for key, value in data.items():
            table.add_row(key, str(value))
        console.print(table)


@app.command("exec")
def exec_(
    ref: str,
    command: list[str] = typer.Argument(..., help="the command (after --); one argument is run as shell text"),
    timeout: float = typer.Option(None, "--timeout", help="seconds (default: the sandbox's)"),
    via_api: bool = typer.Option(False, "--api", help="on whichever worker host holds it, through the API"),
    output: OutputFormat = OutputOption,
) -> None:
    """Run a command in a sandbox's shell; exits with the command's exit code."""
    command = command[1:] if command and command[0] == "--" else command
    text = command[0] if len(command) == 1 else shlex.join(command)
    with readable_errors():
        if via_api:
            from cli.api_client import api_client

            ran = api_client().post(f"/v1/sandboxes/{_sandbox_id(ref)}/exec", json={"command": text, "timeout_s": timeout})
        else:
            sandbox = _open(ref)
            try:
                result = sandbox.step(text, timeout_s=timeout)
            finally:
                sandbox.close_session()
            ran = {"stdout": result.stdout, "exit_code": result.exit_code, "status": result.status.value,
                   "duration_s": result.duration_s, "truncated_bytes": result.truncated_bytes}
    if output is OutputFormat.json:
        print_json(ran)
    else:
        sys.stdout.write(ran["stdout"])
        sys.stdout.flush()
        if ran["status"] != StepStatus.OK.value:
            console.print(f"[dim]status: {ran['status']}[/]", highlight=False)
    raise typer.Exit(ran["exit_code"] if ran["exit_code"] >= 0 else 125)


def _sandbox_id(ref: str) -> str:
    """A sandbox id as the API takes it (the exact id: no container-id prefix across hosts)."""
    if not is_sandbox_id(ref):
        raise SandboxError(f"sandbox: expected a sandbox id (sb- and 10 hex digits) with --api, got {ref[:40]!r}")
    return ref


@app.command()
def shell(ref: str, output: OutputFormat = OutputOption) -> None:
    """An interactive bash in the sandbox (needs the docker CLI; not recorded in history)."""
    with readable_errors():
        sandbox = _open(ref)
        docker = shutil.which("docker")
        argv = ["docker", "exec", "-it", "-u", sandbox.spec.user, "-w", sandbox.spec.workdir,
                sandbox.container_id, "bash", "-l"]
        if output is OutputFormat.json or docker is None:
            print_json({"argv": argv, "docker_cli": docker})
            raise typer.Exit(0 if docker else 1)
        os.execv(docker, argv)


def _split_remote(path: str) -> tuple[str | None, str]:
    ref, sep, rest = path.partition(":")
    if sep and rest.startswith("/") and "/" not in ref:
        return ref, rest
    return None, path


@app.command()
def cp(
    source: str, dest: str,
    via_api: bool = typer.Option(False, "--api", help="on whichever worker host holds it, through the API"),
    output: OutputFormat = OutputOption,
) -> None:
    """Copy files: `cp ID:/path LOCAL` or `cp LOCAL ID:/path` (a trailing / means "into")."""
    with readable_errors():
        src_ref, src_path = _split_remote(source)
        dst_ref, dst_path = _split_remote(dest)
        if (src_ref is None) == (dst_ref is None):
            raise SandboxError(f"cp: expected exactly one side like ID:/path, got {source!r} and {dest!r}")
        if dst_ref is not None:
            local = Path(src_path)
            into = dst_path.endswith("/")
            target_dir = dst_path if into else os.path.dirname(dst_path.rstrip("/")) or "/"
            name = local.name if into else os.path.basename(dst_path)
            data = pack_path(local, arcname=name)
            if via_api:
                from cli.api_client import api_client

                api_client().request("PUT", f"/v1/sandboxes/{_sandbox_id(dst_ref)}/archive", params={"path": target_dir},
                                     content=data, headers={"Content-Type": "application/octet-stream"})
            else:
                _open(dst_ref).put_archive(data, dest=target_dir)
            copied = [f"{target_dir.rstrip('/')}/{name}"]
        else:
            assert src_ref is not None
            if via_api:
                from cli.api_client import api_client

                archive = api_client().request("GET", f"/v1/sandboxes/{_sandbox_id(src_ref)}/archive",
                                               params={"path": src_path}, raw=True)
            else:
                archive = _open(src_ref).get_archive(src_path)
            copied = _copy_out(archive, Path(dst_path))
    print_json({"copied": copied}) if output is OutputFormat.json else console.print("\n".join(copied))


def _copy_out(data: bytes, local: Path) -> list[str]:
    if local.is_dir() or str(local).endswith("/"):
        return [str(local / name) for name in extract_to(data, local)[:1]]
    with tempfile.TemporaryDirectory() as tmp:
        names = extract_to(data, Path(tmp))
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(Path(tmp) / names[0]), local)
    return [str(local)]


@app.command()
def logs(ref: str, tail: int = typer.Option(200, "--tail"), output: OutputFormat = OutputOption) -> None:
    """The container's own output (its entrypoint; commands' output is in `history`/`exec`)."""
    with readable_errors():
        backend = _backend()
        text = backend.logs(admin.find_sandbox(backend, ref).id, tail=tail).decode(errors="replace")
    print_json({"logs": text}) if output is OutputFormat.json else sys.stdout.write(text)


@app.command()
def history(ref: str, output: OutputFormat = OutputOption) -> None:
    """Every command run through a shell session since the last reset, with exit code and duration."""
    with readable_errors():
        entries = admin.history(_open(ref))
    if output is OutputFormat.json:
        print_json([e.__dict__ for e in entries])
        return
    table = Table("#", "WHEN", "EXIT", "STATUS", "SECONDS", "COMMAND")
    for n, e in enumerate(entries, start=1):
        when = time.strftime("%H:%M:%S", time.localtime(e.started_at))
        table.add_row(str(n), when, str(e.exit_code), e.status, f"{e.duration_s:.3f}", e.command[:120])
    console.print(table)


@app.command()
def diff(ref: str, output: OutputFormat = OutputOption) -> None:
    """Workspace changes as a git diff (untracked files included; the repo is not modified)."""
    with readable_errors():
        text = admin.workspace_diff(_open(ref))
    print_json({"diff": text}) if output is OutputFormat.json else sys.stdout.write(text)


@app.command()
def stats(ref: str, output: OutputFormat = OutputOption) -> None:
    """CPU, memory, pids and tmpfs usage."""
    with readable_errors():
        data = admin.stats(_open(ref))
    if output is OutputFormat.json:
        print_json(data)
        return
    table = Table("METRIC", "VALUE", show_header=False)
    for key, value in data.items():
        table.add_row(key, str(value))
    console.print(table)


@app.command()
def rm(
    refs: list[str] = typer.Argument(None, help="sandbox ids or container-id prefixes"),
    all_: bool = typer.Option(False, "--all", help="every sandbox matching the filters"),
    run: str = typer.Option(None, "--run"),
    env: str = typer.Option(None, "--env"),
    state: str = typer.Option(None, "--state"),
    older_than: str = typer.Option(None, "--older-than"),
    dry_run: bool = typer.Option(False, "--dry-run", help="only say what would be removed"),
    output: OutputFormat = OutputOption,
) -> None:
    """Remove sandboxes by id, or `--all` matching filters."""
    with readable_errors():
        backend = _backend()
        if all_:
            older = admin.parse_duration(older_than) if older_than else None
            infos = admin.list_sandboxes(backend, run=run, env=env, state=state, older_than_s=older)
        elif refs:
            infos = [admin.find_sandbox(backend, ref) for ref in refs]
        else:
            raise SandboxError("rm: expected sandbox ids or --all, got neither")
        removed = admin.remove(backend, infos, dry_run=dry_run)
    if output is OutputFormat.json:
        print_json({"removed": removed, "dry_run": dry_run})
    else:
        verb = "would remove" if dry_run else "removed"
        console.print(f"{verb} {len(removed)}: " + " ".join(removed))


@app.command()
def prune(dry_run: bool = typer.Option(False, "--dry-run"), output: OutputFormat = OutputOption) -> None:
    """Remove orphans: dead owner, expired lease, or stopped."""
    with readable_errors():
        verdicts = admin.prune(_backend(), dry_run=dry_run)
    if output is OutputFormat.json:
        print_json([v.__dict__ for v in verdicts])
        return
    table = Table("SANDBOX", "CONTAINER", "REASON", "OWNER", "REMOVED")
    for v in verdicts:
        table.add_row(v.sandbox_id, v.container_id[:12], v.reason, v.owner, str(v.removed))
    console.print(table)
