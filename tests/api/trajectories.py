"""A small, fully populated run written through the ORM: what the API and dashboard tests read.

Run "demo" (running, model = a directory with a tiny word-level tokenizer), two environments,
three groups of G=4 — one trained on at step 1, one degenerate (every reward 0), one still running —
episodes with tool-calling turns, verifier layers, a final diff, timings, sandbox events, two
training steps and two policy versions. Rewards and texts are fixed so the tests can assert on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session
from tokenizers import Tokenizer, models, pre_tokenizers

from core.models import (
    Environment,
    Episode,
    EpisodeGroup,
    PolicyVersion,
    RunEnvironment,
    SandboxEvent,
    TrainingStep,
    Turn,
)
from tests import factories

WORDS = ["<pad>", "<unk>", "fix", "the", "bug", "run", "pytest", "tests", "pass", "edit", "file", "submit", "ok",
         "error", "segfault", "in", "parser", "done"]
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


@dataclass
class SeededRun:
    run_id: int
    environment_ids: list[int]
    group_ids: list[int]
    """trained-on, degenerate, running."""
    episode_ids: list[list[int]] = field(default_factory=list)
    """Per group, by sample index."""
    model_dir: Path | None = None


def write_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer.json over WORDS (ids = positions), enough to decode the seeded turns."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def ids(text: str) -> list[int]:
    return [WORDS.index(word) for word in text.split()]


def _turn(run_id: int, episode_id: int, index: int, *, context: str, completion: str, tool: str | None,
          exit_code: int | None, observation: str, truncated_bytes: int = 0) -> Turn:
    env_ids, sampled = ids(context), ids(completion)
    return Turn(
        run_id=run_id, episode_id=episode_id, index=index, token_ids=env_ids + sampled,
        logprobs=[0.0] * len(env_ids) + [-0.1 * (k + 1) for k in range(len(sampled))],
        loss_mask=[0] * len(env_ids) + [1] * len(sampled), prompt_length=len(env_ids), completion_text=completion,
        tool_call={"name": tool, "arguments": {"command": f"{tool} {index}"}} if tool else None,
        observation=observation, tool_output_full=observation + (" …more" if truncated_bytes else ""),
        exit_code=exit_code, tool_status="ok" if exit_code == 0 else ("error" if tool else None),
        duration_s=0.25 + index, generation_s=0.5, truncated=truncated_bytes > 0, truncated_bytes=truncated_bytes,
        weight_version=0, finish_reason="stop",
    )


SCRIPTS = {  # sample index → (completions, termination, reward, components)
    0: (["run pytest", "edit file", "submit"], "submitted", 1.0, {"format": 1.0, "hidden_tests": 1.0}),
    1: (["run pytest", "run tests", "run tests"], "max_turns", 0.0, {"format": 1.0, "hidden_tests": 0.0}),
    2: (["run pytest", "edit file", "submit"], "submitted", 0.5, {"format": 1.0, "hidden_tests": 0.5}),
    3: (["run pytest", "fix the bug segfault"], "format_error", 0.0, {"format": 0.0, "hidden_tests": 0.0}),
}


def _episode(session: Session, group: EpisodeGroup, sample: int, *, script: int, reward: float | None, running: bool,
             finished: datetime) -> Episode:
    completions, reason, _, components = SCRIPTS[script]
    episode = factories.episode(
        session, group, sample_index=sample, status="running" if running else "completed",
        termination_reason=None if running else reason, reward=None if running else reward,
        reward_components={} if running else components, policy_version=group.policy_version,
        policy_version_last=group.policy_version, num_turns=0 if running else len(completions),
        timings={} if running else {"generation": 1.5, "sandbox": 2.0, "verify": 0.5, "total": 4.2},
        verifier_layers=[] if running else [
            {"name": "format", "score": components["format"], "passed": components["format"] == 1.0, "detail": "",
             "duration_s": 0.01},
            {"name": "hidden_tests", "score": components["hidden_tests"], "passed": components["hidden_tests"] == 1.0,
             "detail": "1 passed" if reward == 1.0 else "1 failed", "duration_s": 0.4}],
        final_diff=None if running else "--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-return a - b\n+return a + b\n",
        sandbox_id=f"sb-{group.id:04d}{sample}", worker="worker-1", attempts=1,
        started_at=finished - timedelta(seconds=5), finished_at=None if running else finished,
    )
    if not running:
        _turns(session, episode, completions)
    return episode


def _turns(session: Session, episode: Episode, completions: list[str]) -> None:
    tokens = 0
    for index, completion in enumerate(completions):
        tool = None if completion.startswith("fix") else completion.split()[0]
        exit_code = None if tool is None else (1 if "tests" in completion else 0)
        observation = "error in parser" if exit_code == 1 else ("ok" if tool else "no tool call")
        turn = _turn(episode.run_id, episode.id, index, context="fix the bug" if index == 0 else "ok",
                     completion=completion, tool=tool, exit_code=exit_code, observation=observation,
                     truncated_bytes=512 if exit_code == 1 else 0)
        tokens += len(turn.token_ids)
        session.add(turn)
    episode.num_tokens = tokens


def _events(session: Session, episode: Episode) -> None:
    kinds = [("create", {"image": "code-repo"}), ("acquire", {"warm": True}),
             ("exec", {"command": "python -m pytest -q", "exit_code": 1}), ("reset", {"mode": "git"}),
             ("release", {"uses": 1})]
    for offset, (kind, detail) in enumerate(kinds):
        session.add(SandboxEvent(sandbox_id=episode.sandbox_id, container_id="c0ffee", kind=kind, worker="worker-1",
                                 run_id=episode.run_id, episode_id=episode.id, duration_ms=10.0 * (offset + 1),
                                 detail=detail, created_at=T0 + timedelta(seconds=offset)))


def _environments(session: Session) -> list[Environment]:
    return [factories.environment(session, name=name, version=1, kind="code_repo", spec={"name": name, "kind": "code_repo"},
                                  description=f"{name} tasks") for name in ["code-fix", "web-nav"]]


def seed_demo_run(session: Session, *, model_dir: Path | None = None, name: str = "demo") -> SeededRun:
    envs = _environments(session)
    tasks = [factories.task(session, env, external_id=f"{env.name}-task", instruction="Fix the bug in calc.py",
                            payload={"repo": {"format": "tar", "data_b64": "x" * 5000}}) for env in envs]
    run = factories.run(session, name=name, status="running", model=str(model_dir) if model_dir else "tiny-served",
                        mode="async", group_size=4, batch_size=1, max_staleness=1, policy_version=2,
                        config={"name": name}, started_at=T0)
    session.add_all(RunEnvironment(run_id=run.id, environment_id=env.id, weight=1.0) for env in envs)
    plans = [(envs[0], tasks[0], "consumed", 1, [1.0, 0.0, 0.5, 0.0]), (envs[1], tasks[1], "complete", None, None),
             (envs[0], tasks[0], "running", None, [1.0, 0.0, None, None])]
    seeded = SeededRun(run_id=run.id, environment_ids=[env.id for env in envs], group_ids=[], model_dir=model_dir)
    for index, (env, task, status, step, rewards) in enumerate(plans):
        group = factories.group(session, env=env, task=task, run=run, group_index=index, size=4,
                                policy_version=index // 2, status=status, consumed_step=step)
        seeded.group_ids.append(group.id)
        members = []
        for sample in range(4):
            reward = 0.0 if rewards is None else rewards[sample]
            running = status == "running" and reward is None
            finished = T0 + timedelta(minutes=index, seconds=sample)
            script = sample if rewards is not None else 1  # the degenerate group: every rollout hits max_turns
            members.append(_episode(session, group, sample, script=script, reward=reward, running=running,
                                    finished=finished).id)
        seeded.episode_ids.append(members)
    first = session.get(Episode, seeded.episode_ids[0][0])
    assert first is not None
    _events(session, first)
    session.add_all([
        TrainingStep(run_id=run.id, step=1, policy_version=1, metrics={"loss/policy": 0.5, "timing_s/train": 3.0}),
        TrainingStep(run_id=run.id, step=2, policy_version=2, metrics={"loss/policy": 0.3, "timing_s/train": 2.0}),
        PolicyVersion(run_id=run.id, version=1, training_step=1), PolicyVersion(run_id=run.id, version=2, training_step=2),
    ])
    session.commit()
    return seeded
