"""`make rl-openenv`: one GRPO run over two OpenEnv environments from PyPI, end to end.

    make rl-openenv                     # = scripts/setup.sh, then .venv/bin/python -m recipes.openenv_rl
    .venv/bin/python -m recipes.openenv_rl --rl-steps 3 --seed 0

The environments are OpenEnv's own servers, each in a sandbox of its image (environments/openenv/images.py),
driven by the worker through the `openenv` kind; their rewards are their own `Observation.reward`:

- `openenv-echo`: openenv-core's `openenv init` environment. The agent says a message with `say`; the
  environment rewards 0.1 × its length (openenv-core 0.3.0's template sets no cap). Two turns; the last
  observation's reward counts.
- `openenv-dipg`: openenv-dipg-safety's DIPG Safety Gym (its rubric of grounding, abstention and format),
  on a local stand-in for its Hub dataset. One turn: `answer` with the whole response.

Stages: the database, the base image, the two OpenEnv images and a tiny model; an SFT warm-up that teaches
the two tools' call format (messages of random length, answers in random forms: no strategy); vLLM on CPU,
one worker on the `openenv` queue, the controller; a train run over both environments and its trainer.
Prints and writes to `<workdir>/result.json`, per environment: the episodes played, those whose every turn
is stored token for token as sampled (the turn's prompt the previous turn's tokens plus what the worker
added), each with its `openenv` layer, the groups the trainer consumed, and the reward per step.
"""

from __future__ import annotations

import json
import random
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from recipes.common import (
    MODEL_HELP,
    Processes,
    RecipeSettings,
    model_option,
    policy_dir,
    prepare,
    render_episode,
    settled,
    sft_in_two_stages,
    sized,
    with_model,
)
from recipes.learning import launch_training, watch_training

ECHO_ENV, DIPG_ENV = "openenv-echo", "openenv-dipg"
LIMITS = {"max_context_tokens": 1024, "max_response_tokens": 64, "episode_timeout_s": 180, "max_tool_errors": 2}
SANDBOX = {"memory": "1536m", "pids": 256, "max_lifetime_s": 3600}
DIPG_FORMAT_PENALTY = -50.0
"""DIPG's own price of a response it cannot read (its FORMAT_MISMATCH_PENALTY): an episode whose calls never
reached it scores this, not 0, which would beat every answer it rewards −20."""


@dataclass(frozen=True)
class OpenEnvRLSettings(RecipeSettings):
    rl_minutes: float = 12.0
    rl_steps: int | None = 3
    sft_steps: int = 200
    sft_batch: int = 16
    sft_lr: float = 3e-3
    sloppy_steps: int = 0
    group_size: int = 4
    batch_size: int = 2
    train_tasks: int = 8
    """Per environment: reset seeds 0 … n-1."""


def specs(images: dict[str, str]) -> list[dict[str, Any]]:
    from environments.openenv.images import RECIPES

    return [
        {"name": ECHO_ENV, "kind": "openenv", "image": images["echo"], "sandbox": SANDBOX,
         "description": "openenv-core's echo environment: longer messages earn more (0.1 a character).",
         "openenv": {"app": RECIPES["echo"].app, "tool": "say"}, "limits": {**LIMITS, "max_turns": 2}},
        {"name": DIPG_ENV, "kind": "openenv", "image": images["dipg"], "sandbox": SANDBOX,
         "description": "openenv-dipg-safety's DIPG Safety Gym on a local dataset.",
         "openenv": {"app": RECIPES["dipg"].app, "env": RECIPES["dipg"].env, "tool": "answer",
                     "no_action_reward": DIPG_FORMAT_PENALTY, "require_done": True},
         "limits": {**LIMITS, "max_turns": 1}},
    ]


def register(settings: OpenEnvRLSettings, images: dict[str, str]) -> dict[str, int]:
    """Both environments and their train tasks, as a user imports them (the payload JSONL of task_lines)."""
    from core.db import session_scope
    from environments.service import register_environment
    from environments.spec import parse_spec
    from environments.tasks import import_uploaded

    counts = {}
    with session_scope() as session:
        for spec in specs(images):
            register_environment(session, spec=parse_spec(spec))
            lines = [json.dumps({"id": f"seed-{seed}", "payload": {"seed": seed}}) for seed in range(settings.train_tasks)]
            counts[spec["name"]] = import_uploaded(session, environment=spec["name"], lines=lines)
    return counts


def _words(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(rng.randint(low, high))).strip() or "a"


@dataclass(frozen=True)
class Seen:
    """What the worker will render for an environment: its system prompt, its tool and first observations."""

    system_prompt: str
    tools: list[dict[str, Any]]
    observations: list[str]


def look(spec: dict[str, Any], *, resets: int) -> Seen:
    """Play `resets` resets of the environment in a sandbox of its image (as the worker does, through the
    kind), to render the warm-up's demonstrations exactly as its episodes will be stored."""
    from environments.openenv.kind import OpenEnvKind, observation_text
    from environments.openenv.task import OpenEnvTask
    from environments.sandboxes import DockerSandboxes
    from environments.spec import parse_spec
    from sandboxes import make_backend
    from sandboxes.events import InMemoryEventSink

    parsed = parse_spec(spec)
    sandboxes = DockerSandboxes(backend=make_backend("docker"), events=InMemoryEventSink(), worker="openenv-rl",
                                min_size=0, max_size=1)
    try:
        with sandboxes.lease(spec=parsed, run_id=None, episode_id=None) as sandbox:
            kind = OpenEnvKind(parsed)
            seen = []
            for seed in range(resets):
                kind.setup(sandbox=sandbox, task=OpenEnvTask(seed=seed))
                seen.append(observation_text(kind._opening.get("observation") or {}))
            return Seen(kind.system_prompt(), kind.tools(), seen)
    finally:
        sandboxes.close()


def demonstrations(settings: OpenEnvRLSettings, seen: dict[str, Seen], *, tokenizer_dir: Path, count: int,
                   seed: int) -> list[tuple[list[int], list[int]]]:
    """The tools' call format on both environments, rendered as the worker stores episodes, with no strategy:
    echo messages of random length, DIPG answers in random forms (tagged or not)."""
    from environments.openenv.kind import observation_text

    rng = random.Random(seed)
    demos = []
    for index in range(count):
        env = (ECHO_ENV, DIPG_ENV)[index % 2]
        instance = rng.randrange(settings.train_tasks)
        look_ = seen[env]
        opening = f"Act in the environment (instance {instance}).\n\n{rng.choice(look_.observations)}"
        if env == ECHO_ENV:
            first, second = _words(rng, 1, 14), _words(rng, 1, 14)
            turns: list[tuple[dict[str, Any], str | None]] = [
                ({"name": "say", "arguments": {"message": first}},
                 observation_text({"echoed_message": first, "message_length": len(first)})),
                ({"name": "say", "arguments": {"message": second}}, None)]
        else:
            said = _words(rng, 3, 30)
            response = rng.choice([said, f"<think>{said}</think><answer>{_words(rng, 1, 12)}</answer>"])
            turns = [({"name": "answer", "arguments": {"llm_response": response}}, None)]
        demos.append(render_episode(tokenizer_dir=tokenizer_dir, system_prompt=look_.system_prompt, tools=look_.tools,
                                    opening=opening, turns=turns, short=False))
    return demos


def token_exact(turns: list[Any], tokenizer: Any) -> bool:
    """Whether an episode's stored turns are what the policy saw and sampled: each turn's arrays aligned (the
    context masked out with logprob 0, each sampled token a logprob ≤ 0), its sampled tokens saying its
    completion text, and each observation verbatim in the tokens of the context the next turn added."""
    import math

    if not turns:
        return False
    for index, turn in enumerate(turns):
        p, n = turn.prompt_length, len(turn.token_ids)
        sampled = turn.logprobs[p:]
        if list(turn.loss_mask) != [0] * p + [1] * (n - p) or any(x != 0 for x in turn.logprobs[:p]) or \
                not all(math.isfinite(x) and x <= 0 for x in sampled):
            return False
        if tokenizer.decode(turn.token_ids[p:], skip_special_tokens=True) != turn.completion_text:
            return False
        if index + 1 < len(turns) and turn.observation and \
                turn.observation not in tokenizer.decode(turns[index + 1].token_ids[:turns[index + 1].prompt_length]):
            return False
    return True


def per_environment(run_id: int, *, tokenizer_dir: Path) -> dict[str, dict[str, Any]]:
    """Per environment: episodes played, those stored token-exact (token_exact), those with an `openenv`
    layer, those whose server state (read after the episode) counted only the episode's own steps (reset
    isolation; DIPG keeps no count), groups consumed, the rewards."""
    from sqlalchemy import func, select
    from transformers import AutoTokenizer

    from core.db import session_scope
    from core.models import Environment, Episode, EpisodeGroup, Turn

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    out: dict[str, dict[str, Any]] = {}
    with session_scope() as session:
        for name in (ECHO_ENV, DIPG_ENV):
            episodes = session.execute(select(Episode).join(Environment, Episode.environment_id == Environment.id)
                                       .where(Episode.run_id == run_id, Environment.name == name,
                                              Episode.status == "completed")).scalars().all()
            exact = layered = own_steps = 0
            for episode in episodes:
                turns = session.execute(select(Turn).where(Turn.run_id == run_id, Turn.episode_id == episode.id)
                                        .order_by(Turn.index)).scalars().all()
                layers = episode.verifier_layers or []
                layered += [layer["name"] for layer in layers] == ["openenv"]
                record = (layers[0].get("record") or {}) if layers else {}
                own_steps += (record.get("state") or {}).get("step_count") == record.get("steps")
                exact += token_exact(list(turns), tokenizer)
            consumed = session.execute(select(func.count()).select_from(EpisodeGroup).join(
                Environment, EpisodeGroup.environment_id == Environment.id).where(
                EpisodeGroup.run_id == run_id, Environment.name == name, EpisodeGroup.consumed_step.is_not(None))).scalar()
            rewards = [e.reward for e in episodes if e.reward is not None]
            out[name] = {"episodes": len(episodes), "token_exact": exact, "openenv_layer": layered,
                         "state_counts_own_steps": own_steps, "consumed_groups": int(consumed or 0),
                         "reward_mean": round(sum(rewards) / len(rewards), 4) if rewards else None,
                         "distinct_rewards": sorted({round(r, 4) for r in rewards})[:12]}
    return out


def run_openenv_rl(settings: OpenEnvRLSettings, *, console: Console) -> dict[str, Any]:
    """Every stage with these settings; returns what it writes to result.json."""
    import shutil

    from environments.images.build import image_tag
    from environments.openenv.images import RECIPES, openenv_image

    settings = settled(settings, name="openenv-rl")
    began = time.monotonic()
    path = prepare(settings, console=console, images=("code-repo",))
    console.print("[bold cyan]▶[/] OpenEnv images: crucible images openenv echo dipg")
    images = {name: openenv_image(name, RECIPES[name], base_tag=image_tag("base")) for name in ("echo", "dipg")}
    counts = register(settings, images)
    console.print(f"  images {images}; tasks {counts}")
    seen = {spec["name"]: look(spec, resets=settings.train_tasks) for spec in specs(images)}
    warm = sft_in_two_stages(
        settings, workdir=path, console=console, batch_size=settings.sft_batch,
        demonstrations=lambda sloppy: demonstrations(settings, seen, tokenizer_dir=policy_dir(settings, path),
                                                     count=16 * settings.train_tasks, seed=settings.seed),
        what=f"{settings.sft_steps} SFT steps on the two tools' call format (random messages and answers)")
    served = path / "served"
    shutil.copytree(warm, served, dirs_exist_ok=True)
    (path / "logs").mkdir(exist_ok=True)
    with Processes(workdir=path, served_dir=served, console=console, startup_timeout_s=settings.vllm_startup_s,
                   max_model_len=LIMITS["max_context_tokens"], queues="celery,openenv",
                   sizing=sized(settings, path, max_model_len=LIMITS["max_context_tokens"])) as procs:
        run_id = launch_training(procs, settings=settings, model=str(warm), environment=[ECHO_ENV, DIPG_ENV],
                                 prefix="openenv-rl")
        curve = watch_training(procs, run_id=run_id, minutes=settings.rl_minutes, console=console,
                               max_steps=settings.rl_steps)
    result: dict[str, Any] = {"run_id": run_id, "images": images, "environments": per_environment(run_id, tokenizer_dir=warm),
                              "steps": len(curve), "curve": curve, "minutes": round((time.monotonic() - began) / 60, 1)}
    (path / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, figures in result["environments"].items():
        console.print(f"  {name}: {figures}")
    console.print(f"\n[bold]run {run_id}: {len(curve)} trainer steps over {ECHO_ENV} and {DIPG_ENV}[/] in "
                  f"{result['minutes']} min; numbers in {path / 'result.json'}")
    return result


def main(
    rl_minutes: float = typer.Option(12.0, help="Wall-clock budget of the RL phase."),
    rl_steps: int | None = typer.Option(3, help="Stop RL after this many trainer steps."),
    sft_steps: int = typer.Option(200, help="Warm-up optimizer steps on the call-format demonstrations."),
    seed: int = typer.Option(0, help="Seed of the model, the tasks and the run."),
    workdir: Path | None = typer.Option(None, help="Default: <data dir>/openenv-rl/<timestamp>."),
    model: Path | None = typer.Option(None, callback=model_option, help=MODEL_HELP),
) -> None:
    """A short real RL run over two OpenEnv environments from PyPI (about 15 minutes on 2 cores)."""
    from cli.console import console

    run_openenv_rl(with_model(OpenEnvRLSettings(rl_minutes=rl_minutes, rl_steps=rl_steps, sft_steps=sft_steps,
                                                seed=seed, workdir=workdir), model), console=console)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(main)
