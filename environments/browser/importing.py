"""Browser tasks for the store: generated (MiniWoB++ names × seeds, a site's seeded generator) or read
from a Crucible JSONL file.

    crucible tasks import miniwob --format miniwob --tasks click-button,enter-text --seeds 10
    crucible tasks import shop --format shop --count 5000
    crucible tasks import shop tasks.jsonl          # Crucible JSONL: environments/task_lines.py

External ids: `miniwob/<name>/<seed>` and `<site>/<index>`, so a re-import updates the same rows. Every
payload is a validated BrowserTask. The options are checked before anything is generated: a bad one
stores nothing.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from core.errors import ConfigError
from environments.browser.sandbox.sites import NAMES as SITE_NAMES
from environments.browser.sandbox.sites import site_module
from environments.browser.task import BrowserTask, miniwob_names
from environments.code_repo.importing import TaskRecord
from environments.task_lines import check_split, parse_payload

GENERATED_FORMATS = ("miniwob", *SITE_NAMES)
MAX_SEEDS = 100_000
MAX_COUNT = 100_000
MAX_TASKS = 1_000_000
"""Tasks one import may generate (names × seeds, or a site's count)."""
MAX_SEED = 2**31 - 1  # BrowserTask's bound: the page's seed is a 31-bit int


def _check_range(field: str, value: int, *, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ConfigError(f"{field}: expected an integer from {low} to {high}, got {value!r:.40}")
    return value


def _task(payload: dict[str, Any], where: str) -> BrowserTask:
    return parse_payload("browser", payload, where)  # type: ignore[no-any-return]


def miniwob_task_names(tasks: str) -> list[str]:
    """`all`, or comma-separated MiniWoB++ task names (each once, in the order given)."""
    known = miniwob_names()
    if not known:
        raise ConfigError("tasks: expected the miniwob package installed here (it lists the MiniWoB++ pages), "
                          "got no such package")
    if tasks.strip() == "all":
        return list(known)
    names = [name.strip() for name in tasks.split(",")]
    if not tasks.strip() or not all(names):
        raise ConfigError(f"tasks: expected 'all' or MiniWoB++ names separated by commas, got {tasks[:200]!r}")
    unknown = [name for name in dict.fromkeys(names) if name not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0][:64], known, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        shown = ", ".join(repr(name[:64]) for name in unknown[:5]) + (f" and {len(unknown) - 5} more"
                                                                     if len(unknown) > 5 else "")
        raise ConfigError(f"tasks: expected MiniWoB++ task names of the miniwob package, got {shown}{hint}; "
                          f"`crucible tasks miniwob-names` lists the {len(known)} known ones, `all` imports them all")
    return list(dict.fromkeys(names))


def miniwob_records(*, tasks: str = "all", seeds: int = 10, seed_start: int = 0,
                    split: str = "train") -> Iterator[TaskRecord]:
    """One task per name × seed: `miniwob/<name>/<seed>`. Checked now, generated as iterated."""
    names = miniwob_task_names(tasks)
    _check_range("seeds", seeds, low=1, high=MAX_SEEDS)
    _check_range("seed_start", seed_start, low=0, high=MAX_SEED - seeds + 1)
    if len(names) * seeds > MAX_TASKS:
        raise ConfigError(f"tasks × seeds: expected at most {MAX_TASKS} tasks in one import, got "
                          f"{len(names)} × {seeds} = {len(names) * seeds}")
    check_split(split)
    return _miniwob(names, range(seed_start, seed_start + seeds), split)


def _miniwob(names: list[str], seeds: range, split: str) -> Iterator[TaskRecord]:
    for name in names:
        for seed in seeds:
            task = BrowserTask(family="miniwob", name=name, seed=seed)
            yield TaskRecord(f"miniwob/{name}/{seed}", f"MiniWoB++ task {name} (seed {seed}); the page states the goal.",
                             split, task.model_dump(mode="json"))


def site_records(site: str, *, count: int, start: int = 0, split: str = "train") -> Iterator[TaskRecord]:
    """Tasks `start` … `start + count - 1` of the site's seeded generator: `<site>/<index>`; the
    instruction is the task's goal. The last index is generated and checked before the first is stored."""
    if site not in SITE_NAMES:
        raise ConfigError(f"format: expected miniwob or a site ({', '.join(SITE_NAMES)}), got {site[:80]!r}")
    _check_range("count", count, low=1, high=MAX_COUNT)
    _check_range("start", start, low=0, high=MAX_SEED - count + 1)
    check_split(split)
    generate = site_module(site).generate_task
    last = start + count - 1
    _task({"family": "site", "navigation": True, **generate(last)}, f"{site}/{last}")
    return _site(site, generate, range(start, start + count), split)


def _site(site: str, generate: Any, indices: range, split: str) -> Iterator[TaskRecord]:
    for index in indices:
        task = _task({"family": "site", "navigation": True, **generate(index)}, f"{site}/{index}")
        yield TaskRecord(f"{site}/{index}", task.goal, split, task.model_dump(mode="json"))


def generated_records(
    format: str, *, tasks: str | None = None, seeds: int | None = None, seed_start: int | None = None,
    count: int | None = None, start: int | None = None, split: str | None = None,
) -> Iterator[TaskRecord]:
    """The records of a generated format; an option of another format (given, not None) is refused."""
    options = {"tasks": tasks, "seeds": seeds, "seed_start": seed_start, "count": count, "start": start}
    own = ("tasks", "seeds", "seed_start") if format == "miniwob" else ("count", "start")
    foreign = [name for name, value in options.items() if value is not None and name not in own]
    if format not in GENERATED_FORMATS:
        raise ConfigError(f"format: expected one of {', '.join(GENERATED_FORMATS)} to generate tasks, got {format[:80]!r}")
    if foreign:
        raise ConfigError(f"{foreign[0]}: expected only {', '.join(own)} with format {format}, got {foreign[0]}="
                          f"{options[foreign[0]]!r:.80}")
    split = "train" if split is None else split
    if format == "miniwob":
        return miniwob_records(tasks="all" if tasks is None else tasks, seeds=10 if seeds is None else seeds,
                               seed_start=seed_start or 0, split=split)
    if count is None:
        raise ConfigError(f"count: expected how many {format} tasks to generate (1 to {MAX_COUNT}), got none")
    return site_records(format, count=count, start=start or 0, split=split)
