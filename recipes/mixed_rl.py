"""`make rl-mixed`: one GRPO run over a code_repo environment and a chat environment, end to end.

    make rl-mixed                      # = scripts/setup.sh, then .venv/bin/python -m recipes.mixed_rl
    .venv/bin/python -m recipes.mixed_rl --rl-steps 4 --seed 0

The seed's "product models face both": verifiable rewards (hidden tests in a fresh sandbox) and a
learned preference reward (a Bradley–Terry reward model served by `crucible rm serve`) in one run, on
different scales, normalised per environment by the trainer before advantages.

- `mixed-code` (kind code_repo, tools bash and submit): a repository holds `number.txt`; the task is
  to put that number in `answer.txt` and submit. The hidden test, added only when grading, compares
  `answer.txt` with the number it was written with (a policy that rewrites `number.txt` gains
  nothing). Reward: the hidden tests layer, 0 or 1.
- `mixed-chat` (kind chat, tool reply): the user asks for a small number in the synthetic preference
  set's words (trainer/synthetic_preferences.py). Reward: the reward model's σ(R) × `chat_scale`
  (100 by default: a percent scale), so chat's rewards spread far wider than code's.

Stages: the database, the `code-repo` image and a tiny model (`prepare`); a reward model trained on
the synthetic preference set (`rm train`'s function, its held-out accuracy printed); an SFT warm-up
on both environments' demonstrations rendered token for token as the agent loop stores episodes,
then a few steps on a sloppy expert's (half of them write or say a wrong number), so groups have
variance for GRPO; vLLM on CPU, one worker on the `code_repo` and `chat` queues, the controller and
the reward model server; a train run over both environments and its trainer. Prints, per step and
environment, the raw reward spread (`reward/{env}/std`), the normalised one (`score/{env}/std`) and
the mean |advantage| (`advantage/{env}/abs_mean`), and writes them to `<workdir>/result.json`.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from core.net import free_port
from recipes.common import (
    MODEL_HELP,
    Processes,
    RecipeSettings,
    make_tiny,
    model_option,
    policy_dir,
    prepare,
    render_episode,
    says_what_stays_running,
    settled,
    sft_in_two_stages,
    sized,
    with_model,
)
from recipes.learning import launch_training, watch_training

CODE_ENV, CHAT_ENV = "mixed-code", "mixed-chat"
CODE_TOOLS, CHAT_TOOLS = ["bash", "submit"], ["reply"]
SANDBOX = {"memory": "256m", "pids": 64, "workspace_size": "16m", "tmp_size": "16m", "max_lifetime_s": 3600}
LIMITS = {"max_context_tokens": 1024, "max_response_tokens": 48, "episode_timeout_s": 120, "tool_timeout_s": 10,
          "max_tool_errors": 2}
CODE_INSTRUCTION = "number.txt holds a number. Put the same number in answer.txt, then submit."
HIDDEN_TEST = ('from pathlib import Path\n\n\ndef test_answer_holds_the_number():\n'
               '    assert (Path(__file__).parent / "answer.txt").read_text().strip() == "{n}"\n')
EXPERT_COMMAND = "cp number.txt answer.txt"


@dataclass(frozen=True)
class MixedRLSettings(RecipeSettings):
    """RecipeSettings (group size, batch size, lr, budgets …) plus the two environments' sizes and scales."""

    rl_minutes: float = 15.0
    rl_steps: int | None = 4
    sft_steps: int = 150
    sft_batch: int = 16
    sft_lr: float = 3e-3
    sloppy_steps: int = 10
    sloppy_lr: float = 1e-3
    wrong_fraction: float = 0.5
    """Share of the sloppy expert's demonstrations that write (code) or say (chat) a wrong number."""
    short_fraction: float = 0.5
    group_size: int = 4
    batch_size: int = 4
    train_tasks: int = 16
    """Per environment."""
    chat_scale: float = 100.0
    """The chat environment's reward model weight: its rewards run from 0 to this (code's from 0 to 1)."""
    rm_pairs: int = 600
    rm_epochs: int = 4

    def __post_init__(self) -> None:
        if self.train_tasks < 1 or self.chat_scale <= 0 or self.rm_pairs < 10 or self.rm_epochs < 1:
            raise ValueError(f"expected train_tasks ≥ 1, chat_scale > 0, rm_pairs ≥ 10 and rm_epochs ≥ 1, got "
                             f"{self.train_tasks}, {self.chat_scale}, {self.rm_pairs} and {self.rm_epochs}")


def code_spec() -> dict[str, Any]:
    return {"name": CODE_ENV, "kind": "code_repo", "image": "code-repo", "tools": CODE_TOOLS,
            "description": "Copy the number in number.txt to answer.txt and submit (hidden test).",
            "sandbox": SANDBOX, "limits": {**LIMITS, "max_turns": 3},
            "verifier": {"weights": {"hidden_tests": 1.0}}}


def chat_spec(settings: MixedRLSettings, *, reward_model_url: str) -> dict[str, Any]:
    return {"name": CHAT_ENV, "kind": "chat", "image": "code-repo", "tools": CHAT_TOOLS,
            "description": "Say the number the user asks for (a reward model scores the reply).",
            "sandbox": SANDBOX, "limits": {**LIMITS, "max_turns": 1},
            "verifier": {"reward_model": {"url": reward_model_url}, "weights": {"reward_model": settings.chat_scale}}}


@dataclass(frozen=True)
class NumberTask:
    external_id: str
    instruction: str
    number: int


def tasks(settings: MixedRLSettings) -> dict[str, list[NumberTask]]:
    """Seeded train tasks of both environments: code numbers from 10 to 99, chat numbers from 1 to 9
    (the reward model's range)."""
    from trainer.synthetic_preferences import PROMPTS

    rng = random.Random(settings.seed)
    code = [NumberTask(f"number/{i}", CODE_INSTRUCTION, rng.randint(10, 99)) for i in range(settings.train_tasks)]
    chat = []
    for i in range(settings.train_tasks):
        n = rng.randint(1, 9)
        chat.append(NumberTask(f"say/{i}", rng.choice(PROMPTS[:2] + PROMPTS[3:4]).format(n=n, p=n - 1), n))
    return {CODE_ENV: code, CHAT_ENV: chat}


def code_payload(number: int) -> dict[str, Any]:
    """A code task's payload: the repository (number.txt, a README) and the hidden test, which holds the
    number itself (rewriting number.txt changes nothing) and is added only when grading."""
    import tempfile

    from environments.code_repo.task import CodeRepoTask, TestSpec, pack_directory

    with tempfile.TemporaryDirectory() as repo:
        (Path(repo) / "number.txt").write_text(f"{number}\n")
        (Path(repo) / "README").write_text("Put the number of number.txt in answer.txt.\n")
        return CodeRepoTask(repo=pack_directory(Path(repo)),
                            hidden_tests=TestSpec(paths=["test_hidden.py"],
                                                  files={"test_hidden.py": HIDDEN_TEST.format(n=number)}),
                            ).model_dump(mode="json")


def register(settings: MixedRLSettings, *, reward_model_url: str) -> dict[str, int]:
    """Both environments and their train tasks (upserted; the code tasks carry their repository)."""
    from sqlalchemy.dialects.postgresql import insert

    from core.db import session_scope
    from core.models import Task
    from environments.service import register_environment
    from environments.spec import parse_spec

    by_env = tasks(settings)
    with session_scope() as session:
        register_environment(session, spec=parse_spec(code_spec()))
        register_environment(session, spec=parse_spec(chat_spec(settings, reward_model_url=reward_model_url)))
        for env, items in by_env.items():
            for task in items:
                payload = code_payload(task.number) if env == CODE_ENV else {"follow_ups": []}
                statement = insert(Task).values(environment_name=env, external_id=task.external_id, split="train",
                                                 instruction=task.instruction, payload=payload, pass_rate_samples=0)
                session.execute(statement.on_conflict_do_update(
                    index_elements=[Task.environment_name, Task.external_id],
                    set_={"instruction": task.instruction, "split": "train", "payload": payload}))
    return {env: len(items) for env, items in by_env.items()}


def demonstration(env: str, task: NumberTask, *, tokenizer_dir: Path, wrong: int | None,
                  short: bool) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one episode of `task` as the agent loop stores it: code copies the
    file (or, with `wrong`, writes that number) then submits; chat replies with the number asked
    (or `wrong`)."""
    from environments.chat.kind import SYSTEM_PROMPT as CHAT_PROMPT
    from environments.chat.kind import TOOL_SCHEMAS as CHAT_SCHEMAS
    from environments.code_repo.kind import SYSTEM_PROMPT as CODE_PROMPT
    from environments.code_repo.tools import TOOL_SCHEMAS as CODE_SCHEMAS

    if env == CODE_ENV:
        command = EXPERT_COMMAND if wrong is None else f"echo {wrong} > answer.txt"
        turns: list[tuple[dict[str, Any], str | None]] = [
            ({"name": "bash", "arguments": {"command": command}}, ""),  # both commands print nothing
            ({"name": "submit", "arguments": {}}, None)]
        return render_episode(tokenizer_dir=tokenizer_dir, system_prompt=CODE_PROMPT,
                              tools=[CODE_SCHEMAS[name] for name in CODE_TOOLS], opening=task.instruction,
                              turns=turns, short=short)
    said = task.number if wrong is None else wrong
    return render_episode(tokenizer_dir=tokenizer_dir, system_prompt=CHAT_PROMPT,
                          tools=[CHAT_SCHEMAS[name] for name in CHAT_TOOLS], opening=task.instruction,
                          turns=[({"name": "reply", "arguments": {"message": str(said)}}, None)], short=short)


def demonstrations(settings: MixedRLSettings, *, tokenizer_dir: Path, sloppy: bool, count: int,
                   seed: int) -> list[tuple[list[int], list[int]]]:
    """`count` demonstrations alternating between the environments; with `sloppy`, `wrong_fraction` of
    them give a wrong number."""
    rng = random.Random(seed)
    by_env = tasks(settings)
    demos = []
    for index in range(count):
        env = (CODE_ENV, CHAT_ENV)[index % 2]
        task = rng.choice(by_env[env])
        wrong = None
        if sloppy and rng.random() < settings.wrong_fraction:
            low, high = (10, 99) if env == CODE_ENV else (1, 9)
            wrong = rng.choice([n for n in range(low, high + 1) if n != task.number])
        demos.append(demonstration(env, task, tokenizer_dir=tokenizer_dir, wrong=wrong,
                                   short=rng.random() < settings.short_fraction))
    return demos


def warm_up(settings: MixedRLSettings, *, workdir: Path, console: Console) -> Path:
    """SFT on an expert's demonstrations of both environments (the tool formats, copying, saying the
    number), then a few steps on a sloppy expert's: RL's groups then hold right and wrong answers."""
    def demos(sloppy: bool) -> list[tuple[list[int], list[int]]]:
        return demonstrations(settings, tokenizer_dir=policy_dir(settings, workdir), sloppy=sloppy,
                              count=8 * settings.train_tasks, seed=settings.seed + (1 if sloppy else 0))

    return sft_in_two_stages(
        settings, workdir=workdir, console=console, batch_size=settings.sft_batch, demonstrations=demos,
        what=f"{settings.sft_steps} SFT steps on both environments' demonstrations, {settings.sloppy_steps} on "
             f"a sloppy expert's ({settings.wrong_fraction:.0%} wrong numbers)")


def train_reward_model(settings: MixedRLSettings, *, workdir: Path, console: Console) -> Path:
    """A Bradley–Terry reward model on the synthetic preference set (the preferred reply gives the number
    asked for), on the tiny model's trunk (made here when the policy is a model of its own); prints its
    held-out pairwise accuracy."""
    import shutil

    from trainer.reward_model import train_reward_model as fit
    from trainer.synthetic_preferences import make_pairs

    started = time.monotonic()
    console.print(f"[bold cyan]▶[/] reward model: {settings.rm_pairs} synthetic preference pairs, "
                  f"{settings.rm_epochs} epochs")
    out = workdir / "rm"
    shutil.rmtree(out, ignore_errors=True)
    if not (workdir / "tiny").is_dir():
        make_tiny(workdir, seed=settings.seed)
    report = fit(pairs=make_pairs(settings.rm_pairs, seed=settings.seed), model_dir=workdir / "tiny", out_dir=out,
                 epochs=settings.rm_epochs, lr=1e-3, seed=settings.seed)
    console.print(f"  held-out pairwise accuracy {report.held_out_accuracy:.2f} ({report.held_out_pairs} pairs) "
                  f"in {time.monotonic() - started:.0f} s")
    return out


ENV_SERIES = ("reward/{env}/std", "score/{env}/std", "advantage/{env}/abs_mean", "reward/{env}/mean")


def per_environment(run_id: int) -> list[dict[str, Any]]:
    """Per step, each environment's raw reward spread, normalised spread and mean |advantage|, as the
    trainer recorded them (the run page charts the same keys)."""
    from sqlalchemy import select

    from core.db import session_scope
    from core.models import TrainingStep

    with session_scope() as session:
        rows = session.execute(select(TrainingStep.step, TrainingStep.metrics).where(TrainingStep.run_id == run_id)
                               .order_by(TrainingStep.step)).all()
    return [{"step": step, **{env: {key.format(env=env): metrics.get(key.format(env=env)) for key in ENV_SERIES}
                              for env in (CODE_ENV, CHAT_ENV)}} for step, metrics in rows]


def _worker_token() -> None:
    """`crucible rm serve` takes the API's bearer tokens: the worker sends CRUCIBLE_API_TOKEN (inherited by
    every process started here), made now in this run's store unless one is set."""
    import os

    from api.services.tokens import create_token
    from core.db import session_scope
    from core.settings import get_settings

    if os.environ.get("CRUCIBLE_API_TOKEN"):
        return
    with session_scope() as session:
        _, token = create_token(session, name="rl-mixed worker")
    os.environ["CRUCIBLE_API_TOKEN"] = token
    get_settings.cache_clear()


@says_what_stays_running
def run_mixed_rl(settings: MixedRLSettings, *, console: Console) -> dict[str, Any]:
    """Every stage with these settings; returns what it writes to result.json."""
    import shutil

    from core.health import wait_healthy
    from recipes.browser_rl import consumed_groups, episodes_of

    settings = settled(settings, name="mixed-rl")
    began = time.monotonic()
    path = prepare(settings, console=console, images=("code-repo",))
    rm_dir = train_reward_model(settings, workdir=path, console=console)
    warm = warm_up(settings, workdir=path, console=console)
    port = free_port()
    rm_url = f"http://127.0.0.1:{port}/v1"
    counts = register(settings, reward_model_url=rm_url)
    console.print(f"  tasks: {counts[CODE_ENV]} {CODE_ENV}, {counts[CHAT_ENV]} {CHAT_ENV} (reward model at {rm_url})")
    served = path / "served"
    shutil.copytree(warm, served, dirs_exist_ok=True)
    (path / "logs").mkdir(exist_ok=True)
    _worker_token()
    with Processes(workdir=path, served_dir=served, console=console, startup_timeout_s=settings.vllm_startup_s,
                   max_model_len=LIMITS["max_context_tokens"], queues="celery,code_repo,chat",
                   sizing=sized(settings, path, max_model_len=LIMITS["max_context_tokens"])) as procs:
        procs.spawn("reward-model", [sys.executable, "-m", "cli.main", "rm", "serve", str(rm_dir), "--port", str(port)])
        child = procs.children["reward-model"]
        wait_healthy(f"http://127.0.0.1:{port}/health", alive=lambda: child.poll() is None, timeout_s=120,
                     what=f"crucible rm serve (log {path / 'logs' / 'reward-model.log'})")
        run_id = launch_training(procs, settings=settings, model=str(warm), environment=[CODE_ENV, CHAT_ENV],
                                 prefix="mixed-rl")
        curve = watch_training(procs, run_id=run_id, minutes=settings.rl_minutes, console=console,
                               max_steps=settings.rl_steps)
    steps = per_environment(run_id)
    result: dict[str, Any] = {
        "run_id": run_id, "environments": [CODE_ENV, CHAT_ENV], "chat_scale": settings.chat_scale,
        "episodes": episodes_of([run_id]), "consumed_groups": consumed_groups(run_id), "steps": steps,
        "minutes": round((time.monotonic() - began) / 60, 1), "curve": curve,
    }
    (path / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"\n  episodes played: {result['episodes']}; groups the trainer consumed: {result['consumed_groups']}")
    console.print("\n  step  environment  reward std (raw)  score std (normalised)  mean |advantage|")
    for point in steps:
        for env in (CODE_ENV, CHAT_ENV):
            raw, norm, adv = (point[env][key.format(env=env)] for key in ENV_SERIES[:3])
            console.print(f"  {point['step']:>4}  {env:<11}  {_fmt(raw):>16}  {_fmt(norm):>22}  {_fmt(adv):>16}")
    console.print(f"\n[bold]run {run_id}: {len(steps)} steps over {CODE_ENV} and {CHAT_ENV}[/] in "
                  f"{result['minutes']} min; numbers in {path / 'result.json'}")
    return result


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "-"


def main(
    rl_minutes: float = typer.Option(15.0, help="Wall-clock budget of the RL phase."),
    rl_steps: int | None = typer.Option(4, help="Stop RL after this many trainer steps."),
    sft_steps: int = typer.Option(150, help="Warm-up optimizer steps on the expert's demonstrations."),
    chat_scale: float = typer.Option(100.0, help="The chat environment's reward scale (code's is 1)."),
    seed: int = typer.Option(0, help="Seed of the model, the tasks and the run."),
    workdir: Path | None = typer.Option(None, help="Default: <data dir>/mixed-rl/<timestamp>."),
    model: Path | None = typer.Option(None, callback=model_option, help=MODEL_HELP),
) -> None:
    """A short real RL run mixing a code_repo and a chat environment (about 15 minutes on 2 cores)."""
    from cli.console import console

    settings = MixedRLSettings(rl_minutes=rl_minutes, rl_steps=rl_steps, sft_steps=sft_steps, chat_scale=chat_scale,
                               seed=seed, workdir=workdir)
    run_mixed_rl(with_model(settings, model), console=console)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(main)
