"""`crucible sandbox browser`: open a browser sandbox on a task, act on it, dump its tree and screenshot.

    crucible sandbox browser --miniwob click-button --seed 3 --screenshot page.png
    crucible sandbox browser --shop 17 --act 'click 12' --act "fill 31 'Ada Lovelace'" -o json
    crucible sandbox browser --miniwob enter-text --keep          # prints the sandbox id; `sandbox rm` ends it
    crucible sandbox browser --attach sb-1a2b3c4d5e --shop 18     # another task in that kept sandbox

Everything is checked before a container is made; the sandbox is removed when the command ends, on
success or error, unless --keep (and then only after the dump succeeded). The browser lives as long as
its driver, which ends with the command that started it: --attach opens a task anew in a kept sandbox
(no container start), it cannot show the page an earlier command left. Exit code 1 when an --act was
refused (the dump is still printed).
"""

from __future__ import annotations

import base64
import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import typer

from cli.console import (
    OutputFormat,
    OutputOption,
    console,
    escape_controls,
    print_json,
    readable_errors,
    safe,
)
from sandboxes import admin
from sandboxes.backend import make_backend
from sandboxes.create import create_sandbox
from sandboxes.errors import SandboxError
from sandboxes.sandbox import Sandbox
from sandboxes.spec import SandboxSpec

BROWSER_SANDBOX = {"memory": "2g", "pids": 1024}  # one Chromium: the episode tests' spec
RUN_LIFETIME_S = 900  # without --keep: a killed command's container ends itself after this (the reaper sooner)
PAGE_FIELDS = ("url", "title", "goal", "tree", "done", "raw_reward", "page_reward", "reason", "screenshot")
_VIEWPORT = re.compile(r"^(\d{1,5})x(\d{1,5})$")


def browser_task(miniwob: str | None, seed: int | None, shop: int | None) -> Any:
    """The BrowserTask the options name (exactly one of --miniwob, --shop)."""
    from environments.browser.sandbox.sites import site_module
    from environments.browser.task import BrowserTask, miniwob_names

    if (miniwob is None) == (shop is None):
        raise SandboxError(f"browser: expected --miniwob NAME or --shop INDEX, got {'both' if miniwob else 'neither'}")
    if miniwob is not None:
        if miniwob not in miniwob_names():
            raise SandboxError(f"--miniwob: expected a MiniWoB++ task of the miniwob package (`crucible tasks "
                               f"miniwob-names` lists them), got {miniwob[:80]!r}")
        if seed is not None and not 0 <= seed <= 2**31 - 1:
            raise SandboxError(f"--seed: expected an integer from 0 to {2**31 - 1}, got {seed}")
        return BrowserTask(family="miniwob", name=miniwob, seed=seed or 0)
    assert shop is not None
    if seed is not None:
        raise SandboxError(f"--seed: expected only with --miniwob (a shop task's index sets its seed), got {seed}")
    if not 0 <= shop <= 2**30 - 1:  # the shop's site seed is 2 × index (+1), a 31-bit int
        raise SandboxError(f"--shop: expected a task index from 0 to {2**30 - 1}, got {shop}")
    return BrowserTask(family="site", navigation=True, **site_module("shop").generate_task(shop))


def parse_action(text: str) -> tuple[str, dict[str, Any]]:
    """`click 12`, `fill 7 'two words'`, `scroll 0 300`, `go_back` → (action, args) as the driver takes them."""
    from environments.browser.kind import TOOL_SCHEMAS

    actions = [name for name in TOOL_SCHEMAS if name != "submit"]  # submit ends an episode; it is no page action
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise SandboxError(f"--act: expected an action like 'click 12' or \"fill 7 'some text'\", got {text[:200]!r} "
                           f"({error})") from None
    if not words or words[0] not in actions:
        got = repr(words[0][:80]) if words else "nothing"
        raise SandboxError(f"--act: expected one of {', '.join(actions)} first, got {got}")
    name, values = words[0], words[1:]
    schema = TOOL_SCHEMAS[name]["function"]["parameters"]
    fields, required = list(schema["properties"].items()), schema["required"]
    if not len(required) <= len(values) <= len(fields):
        wanted = " ".join(key if key in required else f"[{key}]" for key, _ in fields) or "no arguments"
        raise SandboxError(f"--act {name}: expected {wanted}, got {len(values)} argument(s) in {text[:200]!r}")
    args: dict[str, Any] = {}
    for (key, field), value in zip(fields, values, strict=False):
        args[key] = _number(name, key, value) if field.get("type") == "number" else value
    return name, args


def _number(action: str, key: str, value: str) -> int | float:
    try:
        number = int(value)
    except ValueError:
        try:
            number = float(value)  # type: ignore[assignment]
        except ValueError:
            number = math.nan  # type: ignore[assignment]
    if not math.isfinite(number) or abs(number) > 100_000:
        raise SandboxError(f"--act {action}: {key}: expected a number of pixels from -100000 to 100000, "
                           f"got {value[:80]!r}")
    return number


def parse_viewport(text: str) -> list[int]:
    match = _VIEWPORT.match(text)
    size = [int(match.group(1)), int(match.group(2))] if match else []
    if not size or not all(100 <= side <= 4096 for side in size):
        raise SandboxError(f"--viewport: expected WIDTHxHEIGHT, each 100 to 4096, like 800x600, got {text[:80]!r}")
    return size


def _check_screenshot_path(path: Path) -> None:
    if path.is_dir() or not path.parent.is_dir():
        raise SandboxError(f"--screenshot: expected a file path in an existing directory, got {str(path)[:200]!r}")


def browse(sandbox: Sandbox, *, task: Any, actions: list[tuple[str, dict[str, Any]]], viewport: list[int],
           screenshot: bool) -> dict[str, Any]:
    """Open `task`, apply `actions`; the last page (with its screenshot when asked) and each action's error."""
    from sandboxes.errors import ActionRefused

    session = sandbox.browser()
    try:
        page = session.call("open", task=task.driver_payload(), viewport=viewport, screenshot=screenshot and not actions)
        goal = str(page.get("goal") or task.goal)  # the page states a MiniWoB++ goal on open only
        done: list[dict[str, Any]] = []
        for number, (name, args) in enumerate(actions, start=1):
            try:
                page = session.call("act", action=name, args=args, screenshot=screenshot and number == len(actions))
                error = str(page.get("error") or "")
            except ActionRefused as refused:  # the driver refused it outright; the page is unchanged
                error = str(refused)
                if screenshot and number == len(actions):
                    page = {**page, **session.call("observe", screenshot=True)}
            done.append({"action": name, "args": args, "error": error})
        shown = {key: page[key] for key in PAGE_FIELDS if key in page}
        return {**shown, "goal": goal, "actions": done}
    finally:
        session.close()


def _print(data: dict[str, Any]) -> None:
    if data.get("sandbox_id"):
        console.print(f"sandbox {data['sandbox_id']} kept (`crucible sandbox rm {data['sandbox_id']}` removes it)")
    console.print(f"URL: {safe(data.get('url', ''))}", highlight=False)
    if data.get("title"):
        console.print(f"Title: {safe(data['title'])}", highlight=False)
    console.print(f"Goal: {safe(data.get('goal', ''))}", highlight=False)
    for action in data["actions"]:
        outcome = f"[red]error: {safe(action['error'])}[/]" if action["error"] else "ok"
        console.print(f"act {safe(action['action'])} {safe(action['args'])}: {outcome}", highlight=False)
    if "done" in data:
        console.print(f"done: {'yes' if data['done'] else 'no'}, raw reward {data.get('raw_reward', 0)}", highlight=False)
    if data.get("screenshot"):
        console.print(f"screenshot: {safe(data['screenshot'])}", highlight=False)
    console.file.flush()
    sys.stdout.write(escape_controls(data.get("tree", "")).rstrip("\n") + "\n")  # unwrapped: one element a line
    sys.stdout.flush()


def browser(
    miniwob: str = typer.Option(None, "--miniwob", help="a MiniWoB++ task name (`crucible tasks miniwob-names`)"),
    seed: int = typer.Option(None, "--seed", help="with --miniwob: the page's seed (default 0)"),
    shop: int = typer.Option(None, "--shop", help="a shop task index (as `tasks import --format shop` numbers them)"),
    act: list[str] = typer.Option([], "--act", help="an action, repeatable: 'click 12', \"fill 7 'text'\", 'scroll 0 300'"),
    screenshot: Path = typer.Option(None, "--screenshot", help="write the final page's PNG here"),
    viewport: str = typer.Option("800x600", "--viewport", help="WIDTHxHEIGHT"),
    keep: bool = typer.Option(False, "--keep", help="leave the sandbox running (until --ttl or `sandbox rm`)"),
    ttl: str = typer.Option("1h", "--ttl", help="with --keep: the sandbox's lifetime"),
    attach: str = typer.Option(None, "--attach", help="a kept browser sandbox to open the task in"),
    image: str = typer.Option(None, "--image", help="image tag (default: the current crucible/browser)"),
    env_name: str = typer.Option(None, "--env-name", help="environment label (for ls --env)"),
    output: OutputFormat = OutputOption,
) -> None:
    """Open a browser sandbox on a task and dump its URL, goal and accessibility tree (and screenshot)."""
    with readable_errors():
        task = browser_task(miniwob, seed, shop)
        actions = [parse_action(text) for text in act]
        size = parse_viewport(viewport)
        if screenshot is not None:
            _check_screenshot_path(screenshot)
        try:
            lifetime = int(admin.parse_duration(ttl))
        except SandboxError as error:
            raise SandboxError(f"--ttl: {error}") from None
        if attach is not None and (keep or image or env_name):
            raise SandboxError("--attach: expected no --keep, --image or --env-name (the sandbox exists and stays), "
                               "got " + " ".join(f for f, v in (("--keep", keep), ("--image", image),
                                                                 ("--env-name", env_name)) if v))
        backend = make_backend("docker")
        if attach is not None:
            sandbox, created = admin.attach(backend, admin.find_sandbox(backend, attach)), False
        else:
            sandbox, created = _create(backend, image=image, keep=keep, lifetime=lifetime, env_name=env_name), True
        remove = created  # an attached sandbox is never ours to remove; a new one is, until the dump succeeds
        try:
            data = browse(sandbox, task=task, actions=actions, viewport=size, screenshot=screenshot is not None)
            if screenshot is not None:
                _write_png(screenshot, data.pop("screenshot", ""))
                data["screenshot"] = str(screenshot)
            remove = created and not keep
        except SandboxError as error:
            if not created:
                raise SandboxError(f"sandbox {sandbox.id} (image {sandbox.spec.image}): {error}") from None
            raise
        finally:
            if remove:
                sandbox.destroy(reason="cli browser")
            sandbox.close_session()
    data = {"sandbox_id": sandbox.id if keep or not created else None, **data}
    print_json(data) if output is OutputFormat.json else _print(data)
    if any(action["error"] for action in data["actions"]):
        raise typer.Exit(1)


def _write_png(path: Path, data: str) -> None:
    png = base64.b64decode(data or "", validate=True)
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise SandboxError(f"--screenshot: expected a PNG from the browser, got {len(png)} bytes that are not one")
    path.write_bytes(png)


def _create(backend: Any, *, image: str | None, keep: bool, lifetime: int, env_name: str | None) -> Sandbox:
    if image is None:
        from core.settings import get_settings
        from environments.browser.kind import IMAGE
        from environments.images import image_tag

        image = image_tag(IMAGE, base_image=get_settings().sandbox_base_image)
    spec = SandboxSpec(image=image, max_lifetime_s=lifetime if keep else RUN_LIFETIME_S, **BROWSER_SANDBOX)
    if keep:  # no owner: it outlives this command, until its lifetime or `sandbox rm`
        return admin.create_detached(backend, spec=spec, env_name=env_name)
    return create_sandbox(backend=backend, spec=spec, worker="cli", env_name=env_name,  # owned: reaped if we die
                          lease_ttl_s=RUN_LIFETIME_S)
