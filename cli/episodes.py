"""`crucible episodes ls|show`: episodes over the REST API (filters and full-text search run on the server)."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from cli.api_client import api_client
from cli.console import OutputFormat, OutputOption, console, print_json, readable_errors, safe, safe_text

app = typer.Typer(help="Episodes: list with filters and search, show one with its turns.", no_args_is_help=True)


def _reward(value: float | None, *, awaiting: bool = False) -> str:
    if awaiting:  # its judge has not scored it yet (the API gives no reward meanwhile)
        return "judging"
    return "–" if value is None else f"{value:.3f}"


@app.command("ls")
def ls(
    run: int | None = typer.Option(None, "--run", "-r", help="Run id."),
    environment: str | None = typer.Option(None, "--env", "-e", help="Environment name."),
    status: str | None = typer.Option(None, help="pending, running, scoring (awaiting its judge), completed, failed or cancelled."),
    reason: str | None = typer.Option(None, "--reason", help="Termination reason (submitted, max_turns…)."),
    min_reward: float | None = typer.Option(None, help="Only rewards ≥ this."),
    max_reward: float | None = typer.Option(None, help="Only rewards ≤ this."),
    version: int | None = typer.Option(None, "--version", help="Policy version that generated the episode."),
    group: int | None = typer.Option(None, "--group", "-g", help="Episode group id."),
    search: str | None = typer.Option(None, "--search", "-q", help='Full-text search in turns: words, "a phrase", -not.'),
    flag: str | None = typer.Option(None, "--flag", help="Only episodes the hack monitors flagged so (forged_exit…)."),
    limit: int = typer.Option(20, min=1, max=500, help="Rows per page."),
    cursor: str | None = typer.Option(None, help="Continue after a previous page (its next cursor)."),
    output: OutputFormat = OutputOption,
) -> None:
    """Episode summaries, newest first."""
    params = {"run_id": run, "environment": environment, "status": status, "termination_reason": reason,
              "min_reward": min_reward, "max_reward": max_reward, "policy_version": version, "group_id": group,
              "q": search, "flag": flag, "limit": limit, "cursor": cursor}
    with readable_errors():
        page = api_client().get("/v1/episodes", params=params)
    if output is OutputFormat.json:
        print_json(page)
        return
    table = Table("id", "run", "group·sample", "env", "status", "termination", "reward", "version", "turns", "tokens")
    for e in page["data"]:
        table.add_row(str(e["id"]), str(e["run_id"]), f"{e['group_id']}·{e['sample_index']}", safe(e["environment"]),
                      safe(e["status"]), safe(" ".join([e["termination_reason"] or "–", *e.get("flags", [])])),
                      _reward(e["reward"], awaiting=e.get("awaiting_judging", False)),
                      "–" if e["policy_version"] is None else str(e["policy_version"]), str(e["num_turns"]),
                      str(e["num_tokens"]))
    console.print(table)
    if page["next_cursor"]:
        console.print(f"more: --cursor {safe(page['next_cursor'])}", style="dim", highlight=False)


def _print_turn(turn: dict[str, Any]) -> None:
    """Every stored string here was written by the policy or a tool: it goes through `safe_text`."""
    console.print(f"[bold]turn {safe(turn['index'])}[/] · {safe(turn['num_tokens'])} tokens · "
                  f"{safe(turn['finish_reason'] or '–')}", highlight=False)
    console.print(safe_text(turn["completion_text"] or ""))
    call = turn["tool_call"]
    if call:
        exit_code = turn["exit_code"]
        style = "red" if exit_code not in (None, 0) else "green"
        truncated = f" · truncated {turn['truncated_bytes']} bytes" if turn["truncated"] else ""
        name, arguments = (call.get("name"), call.get("arguments")) if isinstance(call, dict) else (call, "")
        console.print(safe_text(f"  → {name} {arguments}", style="cyan"))
        console.print(safe_text(f"  exit {exit_code} · {turn['duration_s']} s{truncated}", style=style))
    if turn["observation"]:
        console.print(safe_text("  " + str(turn["observation"]).replace("\n", "\n  "), style="dim"))


@app.command("show")
def show(
    episode_id: int = typer.Argument(..., help="Episode id."),
    tokens: bool = typer.Option(False, "--tokens", help="Include token ids, logprobs and loss masks (json)."),
    output: OutputFormat = OutputOption,
) -> None:
    """One episode: outcome, reward components, verifier layers and every turn."""
    with readable_errors():
        episode = api_client().get(f"/v1/episodes/{episode_id}", params={"tokens": str(tokens).lower()})
    if output is OutputFormat.json:
        print_json(episode)
        return
    console.print(f"[bold]episode {episode['id']}[/] · run {episode['run_id']} · group {episode['group_id']} "
                  f"sample {episode['sample_index']} · {safe(episode['environment'])} · "
                  f"task {safe(episode['task_external_id'])}", highlight=False)
    console.print(safe_text(f"{episode['status']} · {episode['termination_reason'] or '–'} · "
                            f"reward {_reward(episode['reward'], awaiting=episode.get('awaiting_judging', False))} "
                            f"{episode['reward_components']}"))
    for layer in episode["verifier_layers"]:
        if isinstance(layer, dict):
            console.print(safe_text(f"  verifier {layer.get('name')}: {layer.get('score')} passed={layer.get('passed')}"))
    for turn in episode["turns"]:
        _print_turn(turn)


@app.command("regrade")
def regrade(
    run: int = typer.Option(..., "--run", "-r", help="Run id."),
    steps: str | None = typer.Option(None, "--steps", help="Only episodes consumed by these training steps: A..B, A.., ..B."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="At most this many episodes."),
    output: OutputFormat = OutputOption,
) -> None:
    """Re-score a run's stored submissions with the current grader in fresh sandboxes; the new verdicts are
    stored beside the old (never over them), and the training steps that consumed changed rewards are named."""
    from core.db import session_scope
    from environments.sandboxes import DockerSandboxes
    from sandboxes import make_backend
    from sandboxes.db_events import DbEventSink
    from task_workers.episode.regrade import parse_steps, regrade_run

    with readable_errors():
        bounds = parse_steps(steps)
        events = DbEventSink()
        sandboxes = DockerSandboxes(backend=make_backend("docker"), events=events, worker="regrade", min_size=0,
                                    max_size=2)
        try:
            with session_scope() as session:
                report = regrade_run(session, run_id=run, steps=bounds, sandboxes=sandboxes, limit=limit).as_dict()
        finally:
            sandboxes.close()
    if output is OutputFormat.json:
        print_json(report)
        return
    console.print(f"run {report['run_id']}: {report['regraded']} episodes re-graded by {safe(report['grader'])}, "
                  f"{len(report['changed'])} changed", highlight=False)
    table = Table("episode", "step", "reward then", "reward now", "flags now")
    for row in report["changed"]:
        table.add_row(str(row["episode_id"]), "–" if row["step"] is None else str(row["step"]), _reward(row["before"]),
                      _reward(row["after"]), safe(" ".join(row["flags_after"]) or "–"))
    if report["changed"]:
        console.print(table)
    for row in report["steps"]:
        console.print(f"step {row['step']} trained on {len(row['episodes'])} changed episodes "
                      f"(reward change {row['reward_change']:+.3f})", highlight=False)
    for why, count in report["skipped"].items():
        console.print(f"skipped {count}: {safe(why)}", style="dim", highlight=False)
