"""`crucible env …` and `crucible tasks …`: register environment specs and import their tasks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.json import JSON
from rich.table import Table
from sqlalchemy import func, select

from api.services.tasks import blinding_by_task
from cli.console import OutputFormat, OutputOption, console, err_console, print_json, readable_errors, safe
from core.db import session_scope
from core.errors import ConfigError
from core.models import Environment, Task
from core.settings import get_settings
from environments.browser.importing import GENERATED_FORMATS
from environments.browser.task import miniwob_names
from environments.registry import get_kind
from environments.service import get_environment, list_environments, register_environment, spec_of
from environments.spec import check_network_policy, check_reward_servers, load_spec_file
from environments.task_lines import check_split
from environments.tasks import TaskFormat, import_generated, import_harbor, import_tasks

if TYPE_CHECKING:  # imported where they are used: the CLI starts fast
    from environments.code_repo.factory import FactoryReport
    from environments.spec import EnvironmentSpec
    from task_workers.policy.client import PolicyClient

env_app = typer.Typer(help="Environments: register versioned specs, list and show them.", no_args_is_help=True)
tasks_app = typer.Typer(help="Tasks: import them into an environment and list them.", no_args_is_help=True)


def _quiet_http() -> None:
    """httpx logs every request at INFO: the factory's index pages and calibration's policy probe are noise
    ahead of a command's answer or its one-line error. (A worker keeps them: its masked request lines are
    what tests/task_workers/episode/test_no_secret_in_logs.py greps.)"""
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)


def _env_json(row: Environment) -> dict[str, object]:
    return {"id": row.id, "name": row.name, "version": row.version, "kind": row.kind, "spec_hash": row.spec_hash,
            "created_at": row.created_at, "spec": row.spec}


@env_app.command("register")
def register(path: Path = typer.Argument(..., help="YAML or JSON spec file."), output: OutputFormat = OutputOption) -> None:
    """Register a spec; an unchanged spec keeps its version, a changed one gets the next."""
    with readable_errors():
        spec = load_spec_file(path)  # a bad file is refused before the database is asked anything
        check_network_policy(spec, allowed=get_settings().sandbox_networks)
        check_reward_servers(spec, allows=get_settings().allows_reward_server)
    with readable_errors(), session_scope() as session:
        row, created = register_environment(session, spec=spec)
        data = {**_env_json(row), "created": created}
    if output is OutputFormat.json:
        print_json(data)
    else:
        verb = "registered" if created else "unchanged:"
        console.print(f"{verb} [bold]{data['name']}[/] version {data['version']}")


@env_app.command("ls")
def ls(output: OutputFormat = OutputOption) -> None:
    """The latest version of every environment."""
    with readable_errors(), session_scope() as session:
        rows = [_env_json(row) for row in list_environments(session)]
        counts = dict(session.execute(select(Task.environment_name, func.count()).group_by(Task.environment_name)).all())
    if output is OutputFormat.json:
        print_json([{**row, "tasks": counts.get(str(row["name"]), 0)} for row in rows])
        return
    table = Table("name", "version", "kind", "tasks", "registered")
    for row in rows:
        table.add_row(safe(row["name"]), str(row["version"]), safe(row["kind"]), str(counts.get(str(row["name"]), 0)),
                      f"{row['created_at']:%Y-%m-%d %H:%M}")
    console.print(table)


@env_app.command("show")
def show(name: str, version: int | None = typer.Option(None, min=1), output: OutputFormat = OutputOption) -> None:
    """One environment version (the latest unless --version)."""
    with readable_errors(), session_scope() as session:
        data = _env_json(get_environment(session, name=name, version=version))
    if output is OutputFormat.json:
        print_json(data)
    else:
        console.print(f"[bold]{safe(data['name'])}[/] v{data['version']} ({safe(data['kind'])})")
        console.print(JSON.from_data(data["spec"], ensure_ascii=True))  # C1 controls as \u escapes too


@env_app.command("serve")
def serve(
    name: str = typer.Argument(..., help="A registered environment."),
    openenv: bool = typer.Option(False, "--openenv", help="Speak OpenEnv's protocol (the one served)."),
    port: int = typer.Option(8010, "--port", min=1, max=65535),
    host: str = typer.Option("127.0.0.1", "--host", help="A loopback address: a session is a shell in a sandbox, "
                             "and the protocol has no authentication."),
    split: str = typer.Option("train", "--split", help="The split whose tasks `reset` draws."),
    version: int | None = typer.Option(None, "--version", min=1, help="Environment version (default: latest)."),
    max_sessions: int = typer.Option(8, "--max-sessions", min=1, max=64, help="Concurrent sessions, each with a "
                                     "sandbox of its own."),
    warm: int = typer.Option(0, "--warm", min=0, max=64, help="Sandboxes kept ready for the next reset."),
    idle_timeout: float = typer.Option(300.0, "--idle-timeout", min=1.0, max=86400.0, help="Seconds a session may "
                                       "stay silent (within an episode: at most its time left + 5 s) before it "
                                       "is closed and its sandbox given back."),
) -> None:
    """Serve ENV to OpenEnv clients (TRL, SkyRL, …): a WebSocket session per client at /ws, each leasing a
    sandbox from the warm pool; rewards are the environment's verifier's (task_workers/openenv_server.py)."""
    import ipaddress

    import uvicorn

    from environments.images.registry import catalogued
    from environments.sandboxes import DockerSandboxes
    from sandboxes import make_backend
    from sandboxes.db_events import DbEventSink
    from task_workers.openenv_server import create_app, load_served

    with readable_errors():
        if not openenv:
            raise ConfigError("expected --openenv (the one protocol `crucible env serve` speaks), got none")
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ConfigError(f"--host: expected a loopback address (127.0.0.1, ::1), got {host[:80]!r}")
        with session_scope() as session:
            served = load_served(session, name=name, split=split, version=version)
    sandboxes = DockerSandboxes(backend=make_backend("docker"), events=DbEventSink(), worker=f"openenv-{name}"[:64],
                                min_size=warm, max_size=max(max_sessions, warm), images=catalogued)
    console.print(f"serving [bold]{safe(served.name)}[/] v{served.version} ({len(served.tasks)} tasks of split "
                  f"{safe(split)}) to OpenEnv clients at ws://{host}:{port}/ws", highlight=False)
    app = create_app(served, sandboxes, max_sessions=max_sessions, idle_timeout_s=idle_timeout)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", ws_max_size=2_000_000)
    finally:
        app.state.threads.shutdown(wait=True, cancel_futures=True)
        sandboxes.close()


FILE_FORMATS = ("crucible", "swebench")
FOLDER_FORMATS = ("harbor",)


@tasks_app.command("import")
def import_(
    environment: str = typer.Argument(..., help="Registered environment name."),
    paths: list[Path] | None = typer.Argument(None, help="A JSONL task file (crucible and swebench formats), or "
                                              "Harbor task folders (harbor)."),
    format: str = typer.Option("crucible", "--format", "-f",
                               help="crucible or swebench (files); harbor (folders); miniwob or shop (generated, "
                                    "browser environments)"),
    repos_dir: Path | None = typer.Option(None, help="Where SWE-bench repositories are cloned."),
    image: str | None = typer.Option(None, "--image", help="swebench: each instance's own image, a template "
                                     "with {instance_id} or {instance_key}, e.g. "
                                     "'swebench/sweb.eval.x86_64.{instance_key}:latest' (repository at /testbed); "
                                     "harbor: a local image for the tasks' environment instead of building "
                                     "environment/Dockerfile, {name} the task's name"),
    tasks: str | None = typer.Option(None, "--tasks", help="miniwob: task names separated by commas, or all (default)"),
    seeds: int | None = typer.Option(None, "--seeds", help="miniwob: seeds per task name (default 10)"),
    seed_start: int | None = typer.Option(None, "--seed-start", help="miniwob: the first seed (default 0)"),
    count: int | None = typer.Option(None, "--count", help="shop: how many tasks to generate"),
    start: int | None = typer.Option(None, "--start", help="shop: the first task index (default 0)"),
    split: str | None = typer.Option(None, "--split", help="generated formats and harbor: the tasks' split "
                                     "(default train)"),
    output: OutputFormat = OutputOption,
) -> None:
    """Import (or update) tasks from a JSONL file or Harbor folders, or generate a browser environment's tasks."""
    generated = {"tasks": tasks, "seeds": seeds, "seed_start": seed_start, "count": count, "start": start,
                 "split": split}
    given_paths = list(paths or [])
    formats = (*FILE_FORMATS, *FOLDER_FORMATS, *GENERATED_FORMATS)
    with readable_errors():
        if format not in formats:
            raise ConfigError(f"--format: expected one of {', '.join(formats)}, got {format[:80]!r}")
        if format in (*FILE_FORMATS, *FOLDER_FORMATS):
            if not given_paths:
                what = "Harbor task folders" if format in FOLDER_FORMATS else "a JSONL task file"
                raise ConfigError(f"PATH: expected {what} for --format {format}, got none")
            if format in FILE_FORMATS and len(given_paths) > 1:
                raise ConfigError(f"PATH: expected one JSONL task file for --format {format}, got {len(given_paths)}")
            allowed = {"split"} if format in FOLDER_FORMATS else set()
            given = [f"--{name.replace('_', '-')}" for name, value in generated.items()
                     if value is not None and name not in allowed]
            if given:
                raise ConfigError(f"{given[0]}: expected only with a generated format ({', '.join(GENERATED_FORMATS)}), "
                                  f"got it with --format {format}")
            if format in FOLDER_FORMATS and repos_dir is not None:
                raise ConfigError(f"--repos-dir: expected only with --format swebench, got it with --format {format}")
            if split is not None:
                check_split(split)
        elif image is not None:
            raise ConfigError(f"--image: expected only with --format swebench or harbor, got it with --format {format}")
        elif given_paths or repos_dir is not None:
            raise ConfigError(f"PATH: expected none with --format {format} (its tasks are generated), got "
                              f"{str(given_paths[0] if given_paths else repos_dir)[:200]!r}")
    with readable_errors(), session_scope() as session:
        if format in FOLDER_FORMATS:
            imported = import_harbor(session, environment=environment, folders=given_paths, image=image,
                                     split=split or "train")
        elif given_paths:
            fmt: TaskFormat = "swebench" if format == "swebench" else "crucible"
            imported = import_tasks(session, environment=environment, path=given_paths[0], format=fmt,
                                    repos_dir=repos_dir, image=image)
        else:
            imported = import_generated(session, environment=environment, format=format, **generated)
        blinding = blinding_by_task(session, task_ids=list(session.execute(
            select(Task.id).where(Task.environment_name == environment)).scalars()))
    unblinded = sum(1 for value in blinding.values() if value.startswith("unblinded"))
    if output is OutputFormat.json:
        print_json({"environment": environment, "imported": imported,
                    **({"code_repo_tasks": len(blinding), "unblinded_tasks": unblinded} if blinding else {})})
    else:
        console.print(f"imported {imported} tasks into [bold]{safe(environment)}[/]")
        if blinding:
            console.print(f"its code_repo tasks: {len(blinding) - unblinded} of {len(blinding)} have a reference "
                          f"solution, so their hidden tests are graded blinded (`crucible tasks ls` shows each "
                          f"task's share once graded)", highlight=False)


@tasks_app.command("export")
def export(
    environment: str = typer.Argument(..., help="Registered environment name (a code_repo or agent_program one)."),
    out: Path = typer.Argument(..., help="A folder to write the tasks into, one folder each (made if missing)."),
    format: str = typer.Option("harbor", "--format", "-f", help="harbor: Harbor task folders, read back by the "
                                                               "harbor package"),
    split: str | None = typer.Option(None, "--split", help="Only this split's tasks."),
    output: OutputFormat = OutputOption,
) -> None:
    """Write an environment's tasks as Harbor task folders, then have the `harbor` package read each back."""
    from environments.code_repo.task import CodeRepoTask, TestSpec
    from environments.harbor.convert import read_back, write_folder
    from environments.sandboxes import sandbox_spec_for

    with readable_errors(), session_scope() as session:
        if format not in FOLDER_FORMATS:
            raise ConfigError(f"--format: expected one of {', '.join(FOLDER_FORMATS)}, got {format[:80]!r}")
        env = get_environment(session, name=environment)
        if "harbor" not in get_kind(env.kind).formats:
            raise ConfigError(f"environment {environment!r} is a {env.kind} environment: expected a code_repo or "
                              "agent_program one (Harbor tasks are repositories)")
        spec = spec_of(env)
        query = select(Task.external_id, Task.instruction, Task.payload).where(Task.environment_name == environment)
        if split is not None:
            query = query.where(Task.split == check_split(split))
        rows = list(session.execute(query.order_by(Task.id)))
        if not rows:
            raise ConfigError(f"environment {environment!r}: expected tasks to export, got none"
                              + (f" in split {split!r}" if split else ""))
        out.mkdir(parents=True, exist_ok=True)
        written: dict[Path, tuple[str, TestSpec]] = {}
        for row in rows:
            task = CodeRepoTask.model_validate(row.payload)
            folder = write_folder(out, external_id=row.external_id, instruction=row.instruction, task=task,
                                  image=task.image or sandbox_spec_for(spec).image, environment=environment)
            assert isinstance(task.hidden_tests, TestSpec)
            written[folder.resolve()] = (row.instruction, task.hidden_tests)
        reads = read_back(written)
    version = reads[0].harbor_version
    if output is OutputFormat.json:
        print_json({"environment": environment, "exported": len(written), "out": str(out),
                    "read_back": {"harbor": version, "tasks": [read.name for read in reads]}})
    else:
        console.print(f"exported {len(written)} tasks to {safe(str(out))}; harbor {version} read each back",
                      highlight=False)


def _factory_inputs(*, split: str, requirements: list[str], out: Path,
                    environment: str | None) -> tuple[list[str], EnvironmentSpec]:
    """Check `tasks factory`'s options (ConfigError on a bad one): the normalised --with requirements, and the
    spec to validate in (--env's, which must be a code_repo environment, else the stock code_repo image)."""
    from environments.code_repo.factory.requirements import check_requirements
    from environments.code_repo.kind import CodeRepoKind
    from environments.spec import EnvironmentSpec

    check_split(split)
    extra = check_requirements(requirements, where="--with")
    if out.exists() and not out.is_file():
        raise ConfigError(f"--out: expected a file to write, got {str(out)[:200]!r} (not a file)")
    if environment is not None:
        with session_scope() as session:
            registered = get_environment(session, name=environment)
            if registered.kind != CodeRepoKind.name:
                raise ConfigError(f"--env: expected a code_repo environment, got {environment!r} (a "
                                  f"{registered.kind} environment)")
            spec = EnvironmentSpec.model_validate(registered.spec)
    else:
        spec = EnvironmentSpec.model_validate({"name": "task-factory", "kind": CodeRepoKind.name, "image": "code-repo"})
    return extra, spec


def _print_factory_report(report: FactoryReport, *, environment: str | None, imported: bool) -> None:
    """The factory's report as text: a row per package, then how many tasks went where."""
    table = Table("package", "tests kept", "tried", "kept", "tasks", "s/task", "error")
    for row in report.packages:
        per_task = row.seconds_per_task
        table.add_row(safe(row.package), str(row.tests_kept), str(sum(row.tried.values())), str(sum(row.kept.values())),
                      str(row.tasks), "-" if per_task is None else str(per_task), safe(row.error or ""))
    console.print(table)
    console.print(f"{report.tasks} tasks in {safe(str(report.out))}" + (f", imported into [bold]{safe(environment)}[/]"
                                                                        if imported else ""), highlight=False)


@tasks_app.command("factory")
def factory(
    sources: list[str] = typer.Argument(..., help="Packages: pypi:NAME==VERSION, a directory, an sdist (.tar.gz, "
                                        ".zip), or git:REPOSITORY[@REVISION]."),
    out: Path = typer.Option(..., "--out", help="The JSONL file of tasks to write (repositories inline); the "
                             "report goes beside it as <out>.report.json."),
    environment: str | None = typer.Option(None, "--env", help="A code_repo environment: validate in its image and "
                                           "limits, and import the tasks into it."),
    max_mutations: int = typer.Option(300, "--max-mutations", min=1, max=100_000, help="Mutants validated per package."),
    seed: int = typer.Option(0, "--seed", help="Which mutants are tried first."),
    jobs: int = typer.Option(2, "--jobs", min=1, max=32, help="Mutants validated at once, a sandbox each."),
    split: str = typer.Option("train", "--split", help="The tasks' split."),
    requirements: list[str] = typer.Option([], "--with", help="A requirement every package's tests need besides "
                                           "what it declares (repeatable), e.g. --with hypothesis==6.100.0; a "
                                           "package with any gets its own image."),
    output: OutputFormat = OutputOption,
) -> None:
    """Turn Python packages with tests into repair tasks: break one function at a time, keep each break some
    of the package's own tests catch while the rest pass (docs/environments/task-factory.md)."""
    from environments.code_repo.factory import FactoryOptions, run_factory
    from environments.sandboxes import DockerSandboxes, package_sandboxes
    from sandboxes import make_backend
    from sandboxes.db_events import DbEventSink

    _quiet_http()
    with readable_errors():
        extra, spec = _factory_inputs(split=split, requirements=requirements, out=out, environment=environment)
    options = FactoryOptions(max_mutations=max_mutations, seed=seed, jobs=jobs, split=split, requirements=tuple(extra))
    sandboxes = DockerSandboxes(backend=make_backend("docker"), events=DbEventSink(), worker=f"task-factory-{os.getpid()}",
                                min_size=0, max_size=jobs + 1)
    try:
        report = run_factory(sources, open_sandbox=sandboxes.pool_for(spec).open_fresh, out=out, options=options,
                             progress=lambda line: err_console.print(safe(line), highlight=False),
                             package_sandbox=package_sandboxes(sandboxes, spec, importing=environment is not None))
    finally:
        sandboxes.close()
    imported = None
    if environment is not None and report.tasks:
        with readable_errors(), session_scope() as session:
            imported = import_tasks(session, environment=environment, path=out)
    if output is OutputFormat.json:
        print_json(report.as_dict() | ({"imported": imported} if imported is not None else {}))
    else:
        _print_factory_report(report, environment=environment, imported=bool(imported))
    if not report.tasks:
        raise typer.Exit(1)


def _calibration_policy(policy: str) -> PolicyClient:
    """A client for the policy server at --policy (ConfigError unless it is an http(s) URL answering GET
    /models), on the model it serves, with the local tokenizers when the settings name one."""
    import httpx

    from task_workers.policy.client import PolicyClient, PolicyError, local_tokenizers

    if not policy.startswith(("http://", "https://")) or any(c.isspace() for c in policy):
        raise ConfigError(f"--policy: expected an http(s) URL such as http://127.0.0.1:8000/v1, got {policy[:200]!r}")
    settings = get_settings()
    tokenizer, plain = (local_tokenizers(str(settings.policy_tokenizer)) if settings.policy_tokenizer
                        else (None, None))
    probe = PolicyClient(base_url=policy, retries=0, timeout_s=30)
    try:
        model = probe.model()
    except (httpx.HTTPError, PolicyError, KeyError, IndexError, TypeError, ValueError) as error:
        raise ConfigError(f"--policy: expected a policy server answering GET {policy.rstrip('/')}/models, got "
                          f"{str(error)[:200] or type(error).__name__}") from None
    finally:
        probe.close()
    return PolicyClient(base_url=policy, model=model, tokenizer=tokenizer, plain_tokenizer=plain)


@tasks_app.command("calibrate")
def calibrate_(
    environment: str = typer.Argument(..., help="A registered environment."),
    policy: str = typer.Option(..., "--policy", help="The policy server's OpenAI-compatible base URL, as "
                               "CRUCIBLE_POLICY_URL (http://127.0.0.1:8000/v1)."),
    samples: int = typer.Option(8, "--samples", "-k", min=1, max=1024, help="Episodes per task."),
    split: str = typer.Option("train", "--split", help="The split to calibrate."),
    jobs: int = typer.Option(2, "--jobs", min=1, max=64, help="Episodes played at once, a sandbox each."),
    threshold: float = typer.Option(1.0, "--threshold", help="Score counted as a pass."),
    component: str | None = typer.Option(None, "--component", help="Score this reward component, e.g. hidden_tests."),
    output: OutputFormat = OutputOption,
) -> None:
    """Measure each task's pass rate with POLICY (k episodes a task, played here) and store it with its
    difficulty bucket, which the curriculum's pass-rate band and bucket weights read."""
    from controller.calibration import calibrate
    from core.db import get_engine
    from core.termination import MEASURED_BUCKETS
    from environments.sandboxes import DockerSandboxes
    from sandboxes import make_backend
    from sandboxes.db_events import DbEventSink

    _quiet_http()
    with readable_errors():
        check_split(split)
        with session_scope() as session:
            get_environment(session, name=environment)
        client = _calibration_policy(policy)
        sandboxes = DockerSandboxes(backend=make_backend("docker"), events=DbEventSink(), worker="calibrate",
                                    min_size=0, max_size=jobs + 1)
        try:
            run_id, rates = calibrate(get_engine(), environment=environment, policy=client, sandboxes=sandboxes,
                                      samples=samples, split=split, jobs=jobs, success_threshold=threshold,
                                      component=component,
                                      progress=lambda line: err_console.print(safe(line), highlight=False))
        finally:
            sandboxes.close()
            client.close()
    buckets = {bucket.value: sum(rate["difficulty"] == bucket for rate in rates) for bucket in MEASURED_BUCKETS}
    if output is OutputFormat.json:
        print_json({"run_id": run_id, "environment": environment, "split": split, "samples": samples,
                    "buckets": buckets, "tasks": rates})
        return
    _print_calibration(run_id, rates=rates, buckets=buckets)


def _print_calibration(run_id: int, *, rates: list[dict[str, Any]], buckets: dict[str, int]) -> None:
    """Calibration's result as text: each task's pass rate and bucket, then the count per bucket."""
    table = Table("task", "pass rate", "samples", "difficulty")
    for rate in rates:
        shown = "-" if rate["pass_rate"] is None else f"{rate['pass_rate']:.2f}"
        table.add_row(safe(rate["external_id"]), shown, str(rate["samples"]), safe(rate["difficulty"] or "-"))
    console.print(table)
    console.print(f"run {run_id}: " + ", ".join(f"{count} {bucket}" for bucket, count in buckets.items()), highlight=False)


@tasks_app.command("miniwob-names")
def miniwob_names_(output: OutputFormat = OutputOption) -> None:
    """The MiniWoB++ task names `crucible tasks import ENV --format miniwob --tasks …` accepts."""
    names = list(miniwob_names())
    if output is OutputFormat.json:
        print_json(names)
    else:
        console.print("\n".join(names) if names else "no miniwob package installed here", highlight=False)


@tasks_app.command("ls")
def tasks_ls(environment: str, split: str | None = None, output: OutputFormat = OutputOption) -> None:
    """Tasks of an environment with their split, pass rate and difficulty."""
    with readable_errors(), session_scope() as session:
        query = select(Task.id, Task.external_id, Task.split, Task.pass_rate, Task.difficulty).where(
            Task.environment_name == environment)
        if split:
            query = query.where(Task.split == split)
        rows = [dict(row._mapping) for row in session.execute(query.order_by(Task.id))]
        blinding = blinding_by_task(session, task_ids=[row["id"] for row in rows])
    for row in rows:
        row["blinding"] = blinding.get(row["id"])
    if output is OutputFormat.json:
        print_json(rows)
        return
    table = Table("id", "external id", "split", "pass rate", "difficulty", "blinded (latest grade)")
    for row in rows:
        rate = "-" if row["pass_rate"] is None else f"{row['pass_rate']:.2f}"
        table.add_row(str(row["id"]), safe(row["external_id"]), safe(row["split"]), rate, safe(row["difficulty"] or "-"),
                      safe(row["blinding"] or "-"))
    console.print(table)
