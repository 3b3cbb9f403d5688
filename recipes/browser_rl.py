"""`make rl-browser`: a short real RL run on a few MiniWoB++ tasks with the tiny model, end to end.

    make rl-browser                    # = scripts/setup.sh, then .venv/bin/python -m recipes.browser_rl
    .venv/bin/python -m recipes.browser_rl --rl-minutes 6 --train-seeds 10 --test-seeds 6 --seed 0

The read_number demo's pipeline (recipes/demo.py) on browser episodes: the database, the `browser` image
and a tiny model (`prepare`); real demonstrations, played by the scripted MiniWoB++ solver in a real
browser sandbox and rendered token for token as the agent loop renders an episode (system prompt and
tools, the page as the first user message, each tool call, each observation frame), and the same
tasks played by a sloppy player whose first click is a wrong element (`collect`, `render`); an SFT
warm-up on the solver's episodes, then a few steps on a mix with the sloppy player's (`warm_up`); then vLLM on CPU, a task worker consuming the `browser` queue and the controller
(`Processes`), a held-out evaluation, a GRPO train run with its trainer (`launch_training`,
`watch_training`), and the held-out evaluation again. Prints the per-step success rate and writes it
with the held-out success before and after, overall and per page, to `<workdir>/result.json`.

The held-out split is the train pages at seeds no train task has, and `held_out_pages` (click-link by
default), a page no demonstration and no train episode shows. `bench/learning.py --recipe browser`
runs it over seeds.

Rewards are the MiniWoB++ page's own (1 when the page says the task is solved, -1 for a wrong click
on a page that ends the task, 0 when the turns run out); success is reward 1.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from environments.rewards import SOLVED_AT, total
from recipes.common import (
    MODEL_HELP,
    RecipeSettings,
    model_option,
    policy_dir,
    prepare,
    render_episode,
    says_what_stays_running,
    settled,
    sft_in_two_stages,
    with_model,
)
from recipes.learning import learn

ENV_NAME = "miniwob-rl"
TASKS = ("click-test", "focus-text", "click-dialog", "click-test-2", "click-button")
"""MiniWoB++ pages a 0.8 M-parameter model can learn from a few hundred demonstrations: one click each,
on an element named by the goal (a fixed one, or one of two or a handful of buttons)."""
TOOLS = ["click", "noop"]
"""Every page here is solved by clicks; two tool schemas keep the prompt at ≈ 440 tokens (four: 740)."""
CLICK_TASKS = ("click-button", "click-button-sequence", "click-checkboxes", "click-dialog", "click-link",
               "click-option", "click-tab", "click-test", "click-test-2", "focus-text")
"""Pages of environments/browser/solver.py whose plans only click."""
HELD_OUT_PAGES = ("click-link",)
"""A page only the held-out split has: a click on the link the goal quotes, among the page's text (the
trained pages click buttons, a dialog's button, a text box)."""
HELD_OUT_SEED = 100_000
"""Held-out tasks use seeds from here on; train seeds start at 0: the two never meet."""
RETIRED = "retired"
"""The split given to tasks of the environment from an earlier run with another task set."""
SANDBOX = {"memory": "2g", "pids": 1024, "max_lifetime_s": 3600}


@dataclass(frozen=True)
class BrowserRLSettings(RecipeSettings):
    """RecipeSettings (group size, batch size, lr, eval samples, budgets …) plus the browser tasks; the
    train/held-out task counts follow from `tasks` × seeds."""

    rl_minutes: float = 8.0
    sft_steps: int = 200
    sft_batch: int = 8
    sloppy_steps: int = 10
    sft_lr: float = 3e-3
    sloppy_lr: float = 1e-3
    group_size: int = 4
    batch_size: int = 4
    eval_samples: int = 2
    tasks: tuple[str, ...] = TASKS
    held_out_pages: tuple[str, ...] = HELD_OUT_PAGES
    """Pages in the held-out split only: no demonstration and no train episode ever shows them."""
    train_seeds: int = 10
    test_seeds: int = 6
    max_turns: int = 3
    max_context_tokens: int = 2048
    """Prompt (system + 4 tool schemas ≈ 730 tiny-tokenizer tokens, the page 150–330) plus up to
    `max_turns` actions and observations; measured: click-button's 3 turns take ≈ 1650."""
    wrong_fraction: float = 0.5
    """Share of the sloppy player's demonstrations whose first click is a wrong element."""
    short_fraction: float = 0.7
    train_tasks: int = field(init=False, default=0)
    test_tasks: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        for field_name, pages in (("tasks", self.tasks), ("held_out_pages", self.held_out_pages)):
            unknown = [name for name in pages if name not in CLICK_TASKS]
            if (field_name == "tasks" and not pages) or unknown:
                raise ValueError(f"{field_name}: expected MiniWoB++ pages the scripted solver plays with clicks "
                                 f"alone ({', '.join(CLICK_TASKS)}), got {unknown or list(pages)}")
        if both := sorted(set(self.tasks) & set(self.held_out_pages)):
            raise ValueError(f"held_out_pages: expected pages no train task shows, got {both} (also in tasks)")
        if self.train_seeds < 1 or self.test_seeds < 1:
            raise ValueError(f"train_seeds and test_seeds: expected at least 1 each, got {self.train_seeds} and "
                             f"{self.test_seeds}")
        object.__setattr__(self, "train_tasks", len(self.tasks) * self.train_seeds)
        object.__setattr__(self, "test_tasks", (len(self.tasks) + len(self.held_out_pages)) * self.test_seeds)


def env_spec(settings: BrowserRLSettings) -> dict[str, Any]:
    return {
        "name": ENV_NAME, "kind": "browser", "image": "browser",
        "description": f"MiniWoB++ pages ({', '.join(settings.tasks)}; held out only: "
                       f"{', '.join(settings.held_out_pages) or 'none'}): the page's own reward.",
        "tools": TOOLS, "browser": {"screenshots": "none"}, "sandbox": SANDBOX,
        "limits": {"max_turns": settings.max_turns, "max_context_tokens": settings.max_context_tokens,
                   "max_response_tokens": 48, "episode_timeout_s": 120, "tool_timeout_s": 10, "max_tool_errors": 2},
        "verifier": {"weights": {"page": 1.0}},
    }


def task_seeds(settings: BrowserRLSettings) -> dict[str, list[tuple[str, int]]]:
    """split -> [(task name, seed)]: the train pages at train seeds; the held-out split has them at other
    seeds, and the held-out pages."""
    return {"train": [(name, seed) for name in settings.tasks for seed in range(settings.train_seeds)],
            "test": [(name, HELD_OUT_SEED + seed) for name in (*settings.tasks, *settings.held_out_pages)
                     for seed in range(settings.test_seeds)]}


def register(settings: BrowserRLSettings) -> dict[str, int]:
    """The browser environment and its MiniWoB++ tasks (`miniwob/<name>/<seed>`, upserted); the
    environment's other tasks (an earlier run's) go to the `retired` split, so no run draws them."""
    from sqlalchemy import update
    from sqlalchemy.dialects.postgresql import insert

    from core.db import session_scope
    from core.models import Task
    from environments.browser.task import BrowserTask
    from environments.service import register_environment
    from environments.spec import parse_spec

    ids = []
    with session_scope() as session:
        register_environment(session, spec=parse_spec(env_spec(settings)))
        for split, pairs in task_seeds(settings).items():
            for name, seed in pairs:
                payload = BrowserTask(family="miniwob", name=name, seed=seed).model_dump(mode="json")
                external_id = f"miniwob/{name}/{seed}"
                instruction = f"MiniWoB++ task {name} (seed {seed}); the page states the goal."
                ids.append(external_id)
                statement = insert(Task).values(environment_name=ENV_NAME, external_id=external_id, split=split,
                                                 instruction=instruction, payload=payload, pass_rate_samples=0)
                session.execute(statement.on_conflict_do_update(
                    index_elements=[Task.environment_name, Task.external_id],
                    set_={"instruction": instruction, "split": split, "payload": payload}))
        session.execute(update(Task).where(Task.environment_name == ENV_NAME, Task.external_id.not_in(ids))
                        .values(split=RETIRED))
    return {"train": settings.train_tasks, "test": settings.test_tasks}


# -- demonstrations -------------------------------------------------------------------------------
@dataclass
class Played:
    """One scripted episode in a real browser sandbox: the opening text, then (tool call, observation
    or None when the episode ended) per turn, and the page's reward."""

    name: str
    seed: int
    opening: str
    turns: list[tuple[dict[str, Any], str | None]]
    reward: float
    wrong: bool


def _calls(plan: list[str]) -> list[dict[str, Any]]:
    return [json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0]) for text in plan]


def _wrong_call(opening: str, right: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
    """A plausible mistake: a click on another element of the solving element's role (the other
    button), else on any other element of the page; None when the page has no other element."""
    import re

    elements = re.findall(r"\[(\d+)\] (\S+) ", opening)
    target = right["arguments"].get("bid")
    role = dict(elements).get(target)
    others = [bid for bid, kind in elements if bid != target]
    alike = [bid for bid, kind in elements if bid != target and kind == role]
    pool = alike or others
    return {"name": "click", "arguments": {"bid": rng.choice(pool)}} if pool else None


def play(kind: Any, sandbox: Any, *, name: str, seed: int, sloppy: bool = False, rng: random.Random) -> Played:
    """Open the page and play the solver's plan until the page ends the task or the plan ends; the
    sloppy player first clicks a wrong element (`_wrong_call`)."""
    from environments.base import ToolCall
    from environments.browser.solver import SOLVERS
    from environments.browser.task import BrowserTask

    task = BrowserTask(family="miniwob", name=name, seed=seed)
    kind.setup(sandbox=sandbox, task=task)
    opening = kind.opening(sandbox=sandbox, task=task, instruction="").text
    goal = opening.split("\n", 2)[1]
    calls = _calls(SOLVERS[name](goal, opening[opening.find("# Page"):]))
    if sloppy:
        first = _wrong_call(opening, calls[0], rng)
        calls = [first, *calls] if first else calls
    turns: list[tuple[dict[str, Any], str | None]] = []
    for call in calls:
        result = kind.execute(sandbox=sandbox, call=ToolCall(name=call["name"], arguments=call["arguments"]),
                              task=task)
        turns.append((call, None if result.ends_episode else result.observation))
        if result.ends_episode:
            break
    verdict = kind.verify(sandbox=sandbox, task=task, submitted=False, open_sandbox=None, actions=[])
    return Played(name, seed, opening, turns, total(verdict.layers, verdict.flags, kind.spec).value, sloppy)


def collect(settings: BrowserRLSettings, *, image: str) -> list[Played]:
    """Per train task, two real episodes in one browser sandbox: the solver's and the sloppy player's
    (a wrong click first, then the solver's plan if the page is still open). A solver's episode that
    the page does not reward is no demonstration; it is counted (click-test-2 sometimes draws its two
    buttons overlapping, and a click on one lands on the other)."""
    from environments.browser.kind import BrowserKind
    from environments.spec import parse_spec
    from sandboxes import SandboxSpec, create_sandbox, make_backend

    kind = BrowserKind(parse_spec({**env_spec(settings), "image": image}))
    rng = random.Random(settings.seed)
    sandbox = create_sandbox(backend=make_backend(), spec=SandboxSpec(image=image, **SANDBOX))
    played: list[Played] = []
    try:
        for name, seed in task_seeds(settings)["train"]:
            played += [play(kind, sandbox, name=name, seed=seed, rng=rng),
                       play(kind, sandbox, name=name, seed=seed, sloppy=True, rng=rng)]
    finally:
        sandbox.destroy(reason="browser_rl demonstrations collected")
    return played


def render(episode: Played, *, tokenizer_dir: Path, short: bool,
           sampled: list[list[int]] | None = None) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of `episode` exactly as the agent loop stores it (recipes.common.render_episode):
    the browser's system prompt and tools, the opening page as the first user message."""
    from environments.browser.kind import SYSTEM_PROMPT, TOOL_SCHEMAS

    return render_episode(tokenizer_dir=tokenizer_dir, system_prompt=SYSTEM_PROMPT,
                          tools=[TOOL_SCHEMAS[name] for name in TOOLS], opening=episode.opening, turns=episode.turns,
                          short=short, sampled=sampled)


def demonstrations(played: list[Played], *, settings: BrowserRLSettings, tokenizer_dir: Path, sloppy: bool,
                   count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """`count` rendered episodes drawn from `played`: the solver's rewarded ones, or with `sloppy` a
    mix where `wrong_fraction` are the sloppy player's (its wrong first click included)."""
    rng = random.Random(seed)
    expert = [p for p in played if not p.wrong and p.reward >= SOLVED_AT]
    wrong = [p for p in played if p.wrong]
    if not expert:
        raise RuntimeError("no demonstration: the scripted solver earned reward 1 on none of the train tasks")
    demos = []
    for _ in range(count):
        pool = wrong if sloppy and wrong and rng.random() < settings.wrong_fraction else expert
        demos.append(render(rng.choice(pool), tokenizer_dir=tokenizer_dir, short=rng.random() < settings.short_fraction))
    return demos


def warm_up(settings: BrowserRLSettings, played: list[Played], *, workdir: Path, console: Console) -> Path:
    """SFT on the solver's episodes (the model learns the tool format and where to click), then a few
    steps on the sloppy player's mix (it learns to click the wrong element too): RL has to find out
    that the right element pays."""
    def demos(sloppy: bool) -> list[tuple[list[int], list[int]]]:
        return demonstrations(played, settings=settings, tokenizer_dir=policy_dir(settings, workdir), sloppy=sloppy,
                              count=2 * settings.train_tasks, seed=settings.seed + (1 if sloppy else 0))

    return sft_in_two_stages(
        settings, workdir=workdir, console=console, batch_size=settings.sft_batch, demonstrations=demos,
        what=f"{settings.sft_steps} SFT steps on the solver's episodes, {settings.sloppy_steps} on a sloppy "
             f"player's ({settings.wrong_fraction:.0%} wrong first clicks)")


def episodes_of(run_ids: list[int]) -> dict[str, int]:
    """Completed episodes of these runs per environment kind (what the worker played)."""
    from sqlalchemy import func, select

    from core.db import session_scope
    from core.models import Environment, Episode

    with session_scope() as session:
        rows = session.execute(select(Environment.kind, func.count()).join(Episode, Episode.environment_id ==
                                                                           Environment.id)
                               .where(Episode.run_id.in_(run_ids), Episode.status == "completed")
                               .group_by(Environment.kind)).all()
    return {kind: int(count) for kind, count in rows}


def consumed_groups(run_id: int) -> dict[str, int]:
    """Groups of the train run that trainer steps consumed, per environment kind."""
    from sqlalchemy import func, select

    from core.db import session_scope
    from core.models import Environment, EpisodeGroup

    with session_scope() as session:
        rows = session.execute(select(Environment.kind, func.count()).join(EpisodeGroup, EpisodeGroup.environment_id ==
                                                                           Environment.id)
                               .where(EpisodeGroup.run_id == run_id, EpisodeGroup.consumed_step.is_not(None))
                               .group_by(Environment.kind)).all()
    return {kind: int(count) for kind, count in rows}


def by_page(run_id: int) -> dict[str, dict[str, Any]]:
    """An eval run's pass@1 per MiniWoB++ page, with its 95 % interval (tasks resampled: core.stats.task_rate),
    from `crucible eval`'s own per-task counts (api.services.run_eval.task_counts)."""
    from collections import defaultdict

    from sqlalchemy import select

    from api.services.run_eval import task_counts
    from core.db import session_scope
    from core.models import Task
    from core.stats import task_rate

    per_page: dict[str, list[tuple[int, int]]] = defaultdict(list)
    with session_scope() as session:
        rows = task_counts(session, run_id=run_id)
        pages = {task_id: str(name) for task_id, name in session.execute(
            select(Task.id, Task.payload["name"].astext).where(Task.id.in_([row.task_id for row in rows])))}
    for row in rows:
        if row.counted:
            per_page[pages[row.task_id]].append((int(row.counted), int(row.solved)))
    out = {}
    for page, counts in sorted(per_page.items()):
        rate = task_rate(counts, 1)
        out[page] = {"tasks": len(counts), "success": round(rate.value, 4),
                     "interval": [round(rate.low, 4), round(rate.high, 4)]}
    return out


def rendering_check(run_ids: list[int], *, tokenizer_dir: Path, limit: int = 200) -> dict[str, int]:
    """Re-render stored episodes of these runs with `render` (their opening page, observations, and
    the tokens the policy sampled for each action) and count those whose token ids and loss mask equal
    what the worker stored: the warm-up frames its demonstrations exactly as the agent loop does.
    Compared: completed episodes whose every turn stopped on <|im_end|> with a parsed tool call.
    `canonical`: those whose sampled actions are, token for token, the demonstrations' rendering of
    the call (a sample may spell the same text with other tokens, or add text after the call)."""
    from sqlalchemy import select

    from core.db import session_scope
    from core.models import Episode, Turn
    from core.models.artifact import EpisodeArtifact

    compared = matched = canonical = 0
    with session_scope() as session:
        episodes = session.execute(select(Episode.id).where(Episode.run_id.in_(run_ids), Episode.status == "completed")
                                   .order_by(Episode.id).limit(limit)).scalars().all()
        for episode_id in episodes:
            turns = session.execute(select(Turn).where(Turn.episode_id == episode_id).order_by(Turn.index)).scalars().all()
            opening = session.execute(select(EpisodeArtifact.data).where(
                EpisodeArtifact.episode_id == episode_id, EpisodeArtifact.name == "observation")).scalar()
            if not turns or opening is None or any(t.tool_call is None or t.finish_reason != "stop" for t in turns):
                continue
            steps = [(t.tool_call or {}, t.observation if i < len(turns) - 1 else None) for i, t in enumerate(turns)]
            episode = Played("", 0, opening.decode(), steps, 0.0, False)
            sampled = [t.token_ids[t.prompt_length:] for t in turns]
            ids, mask = render(episode, tokenizer_dir=tokenizer_dir, short=False, sampled=sampled)
            stored_ids = [token for t in turns for token in t.token_ids]
            stored_mask = [bit for t in turns for bit in t.loss_mask]
            compared += 1
            matched += ids == stored_ids and mask == stored_mask
            canonical += render(episode, tokenizer_dir=tokenizer_dir, short=False)[0] == stored_ids
    return {"compared": compared, "matched": matched, "canonical": canonical}


@says_what_stays_running
def run_browser_rl(settings: BrowserRLSettings, *, console: Console) -> dict[str, Any]:
    """Every stage with these settings; returns what it writes to result.json."""

    from environments.images import build_images

    settings = settled(settings, name="browser-rl")
    began = time.monotonic()
    path = prepare(settings, console=console, images=("browser",))
    image = {built.name: built.tag for built in build_images(names=["browser"])}["browser"]
    started = time.monotonic()
    console.print(f"[bold cyan]▶[/] demonstrations: the scripted solver and a sloppy player on "
                  f"{settings.train_tasks} train tasks ({', '.join(settings.tasks)}) in a real browser sandbox")
    played = collect(settings, image=image)
    solved = sum(p.reward >= SOLVED_AT for p in played if not p.wrong)
    console.print(f"  {len(played)} episodes in {time.monotonic() - started:.0f} s: the solver earned 1 on "
                  f"{solved}/{settings.train_tasks}, the sloppy player on "
                  f"{sum(p.reward >= SOLVED_AT for p in played if p.wrong)}/{settings.train_tasks}")
    warm = warm_up(settings, played, workdir=path, console=console)
    counts = register(settings)
    console.print(f"  tasks: {counts['train']} train, {counts['test']} held-out ({ENV_NAME})")
    learned = learn(settings, path=path, warm=warm, environment=ENV_NAME, prefix="browser-rl", console=console,
                    queues="celery,browser", max_model_len=settings.max_context_tokens)
    before, after, run_id, curve = learned.before, learned.after, learned.run_id, learned.curve
    rendering = rendering_check([before.run_id, run_id, after.run_id], tokenizer_dir=policy_dir(settings, path))
    pages_before, pages_after = by_page(before.run_id), by_page(after.run_id)
    sloppy_solved = sum(p.reward >= SOLVED_AT for p in played if p.wrong)
    result: dict[str, Any] = {
        **learned.figures(), "environment": ENV_NAME, "tasks": list(settings.tasks),
        "held_out_pages": list(settings.held_out_pages),
        "held_out_by_page": {page: {"before": pages_before.get(page), "after": pages_after.get(page)}
                             for page in (*settings.tasks, *settings.held_out_pages)},
        "train_tasks": settings.train_tasks, "test_tasks": settings.test_tasks,
        "episodes": episodes_of([before.run_id, run_id, after.run_id]),
        "consumed_groups": consumed_groups(run_id), "rendering": rendering,
        "demonstrations": {"solver_solved": solved, "sloppy_solved": sloppy_solved, "train_tasks": settings.train_tasks},
        "minutes": round((time.monotonic() - began) / 60, 1), "curve": curve,
    }
    (path / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"  episodes played: {result['episodes']}; groups the trainer consumed: {result['consumed_groups']}; "
                  f"stored episodes re-rendered token for token as the warm-up renders them: "
                  f"{rendering['matched']}/{rendering['compared']} ({rendering['canonical']} with the "
                  f"demonstrations' very action tokens)")
    console.print("\n  held-out page      before → after")
    for page, cell in result["held_out_by_page"].items():
        shown = [f"{c['success']:.0%}" if c else "-" for c in (cell["before"], cell["after"])]
        new = " (never trained on)" if page in settings.held_out_pages else ""
        console.print(f"  {page:<17}  {shown[0]} → {shown[1]}{new}")
    console.print("\n  step  train success")
    for point in curve:
        console.print(f"  {point['step']:>4}  {point['success']:.0%}" if point["success"] is not None
                      else f"  {point['step']:>4}  -")
    console.print(f"\n[bold]held-out success: {before.success:.0%} [{before.low:.0%}–{before.high:.0%}] → "
                  f"{after.success:.0%} [{after.low:.0%}–{after.high:.0%}] ({result['delta_points']:+.1f} points)[/] "
                  f"in {result['minutes']} min. Run {run_id} stays in the store (`crucible run show {run_id}`); "
                  f"curve and numbers in {path / 'result.json'}")
    return result


DEFAULTS = BrowserRLSettings()


def main(
    rl_minutes: float = typer.Option(DEFAULTS.rl_minutes, help="Wall-clock budget of the RL phase."),
    rl_steps: int | None = typer.Option(None, help="Stop RL after this many trainer steps (default: the minutes)."),
    sft_steps: int = typer.Option(DEFAULTS.sft_steps, help="Warm-up optimizer steps on the solver's episodes."),
    train_seeds: int = typer.Option(DEFAULTS.train_seeds, help="Train tasks per MiniWoB++ page."),
    test_seeds: int = typer.Option(DEFAULTS.test_seeds, help="Held-out tasks per MiniWoB++ page."),
    held_out_pages: str = typer.Option(",".join(DEFAULTS.held_out_pages),
                                       help="Comma-separated pages only the held-out split has ('' for none)."),
    seed: int = typer.Option(0, help="Seed of the model, the demonstrations and the run."),
    workdir: Path | None = typer.Option(None, help="Default: <data dir>/browser-rl/<timestamp>."),
    model: Path | None = typer.Option(None, callback=model_option, help=MODEL_HELP),
) -> None:
    """A short real RL run on MiniWoB++ pages with the tiny model (about 20 minutes on 2 cores)."""
    from cli.console import console

    try:
        settings = BrowserRLSettings(rl_minutes=rl_minutes, rl_steps=rl_steps, sft_steps=sft_steps,
                                     train_seeds=train_seeds, test_seeds=test_seeds, seed=seed, workdir=workdir,
                                     held_out_pages=tuple(page.strip() for page in held_out_pages.split(",")
                                                          if page.strip()))
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    run_browser_rl(with_model(settings, model), console=console)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(main)
