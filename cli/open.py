"""`crucible open REF`: print the dashboard link of a run, group or episode (`--browser` opens it).

    crucible open 3            # run 3
    crucible open episode/812  # also e812, ep:812, group/40, g40, run/3
"""

from __future__ import annotations

import re
import webbrowser

import typer

from cli.api_client import api_client
from cli.console import OutputFormat, OutputOption, console, print_json, readable_errors
from core.errors import ConfigError

KINDS = {"run": "run", "runs": "run", "r": "run", "group": "group", "groups": "group", "g": "group",
         "episode": "episode", "episodes": "episode", "ep": "episode", "e": "episode"}
CHECKS = {"run": "/v1/runs/{id}", "group": "/v1/groups/{id}", "episode": "/v1/episodes/{id}"}
PAGES = {"run": "/runs/{id}", "group": "/groups/{id}", "episode": "/episodes/{id}"}
_REF = re.compile(r"^(?:(?P<kind>[a-z]+)[/:-]?)?(?P<id>\d+)$")


def parse_ref(ref: str) -> tuple[str, int]:
    """`3` → (run, 3); `episode/812`, `e812`, `ep:812` → (episode, 812); `group/40`, `g40` → (group, 40)."""
    match = _REF.match(ref.strip().lower())
    kind = KINDS.get(match.group("kind") or "run") if match else None
    if match is None or kind is None:
        raise ConfigError(f"expected a run, group or episode like 3, run/3, group/40 or episode/812, got {ref!r}")
    return kind, int(match.group("id"))


def open_(
    ref: str = typer.Argument(..., help="run id, or run/ID, group/ID, episode/ID (also r3, g40, e812)."),
    browser: bool = typer.Option(False, "--browser", "-b", help="Also open it in a web browser."),
    check: bool = typer.Option(True, "--check/--no-check", help="Ask the API that it exists first."),
    output: OutputFormat = OutputOption,
) -> None:
    """Print the dashboard link of a run, group or episode."""
    with readable_errors():
        kind, id_ = parse_ref(ref)
        client = api_client()
        if check:
            client.get(CHECKS[kind].format(id=id_))
        url = client.dashboard_url(PAGES[kind].format(id=id_))
    if output is OutputFormat.json:
        print_json({"kind": kind, "id": id_, "url": url})
    else:
        console.print(url, highlight=False, soft_wrap=True)
    if browser:
        webbrowser.open(url)
