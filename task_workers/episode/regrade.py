"""Re-grade what was already trained on: stored submissions scored again by the current grader.

    report = regrade_run(session, run_id=7, steps=(3, 9), sandboxes=provider)   # `crucible episodes regrade`
    report.changed            # the episodes whose reward the current grader changed
    report.steps              # per training step that consumed them: how many, and by how much

A grader improves over time (ARCHITECTURE.md, grading): a reward hole found today was paid for by every
step that trained on it. Each completed code_repo episode's `final_diff` is applied to its task's base in
a fresh sandbox; that sandbox stands for the agent's, and the environment's own verifier grades it with
its fresh sandboxes exactly as the worker did (the agent's shell commands come from its stored turns).
The new verdict is stored in `episode_regrades` beside the original, never over it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.errors import ConfigError, CrucibleError, NotFound
from core.models import Environment, Episode, EpisodeGroup, EpisodeRegrade, Run, Task, Turn
from core.regrades import Regraded, changed_steps
from environments.base import GraderFault, ToolCall
from environments.code_repo import repo
from environments.code_repo.kind import CodeRepoKind
from environments.registry import get_kind
from environments.rewards import total
from environments.service import spec_of
from task_workers.episode.driver import SandboxProvider, prepare_task
from task_workers.episode.persist import layer_record

_GRADER_SOURCES = Path(repo.__file__).parent


def grader_version() -> str:
    """A digest of the code that grades a code_repo episode: a regrade names the grader it used."""
    digest = hashlib.sha256()
    for path in sorted(_GRADER_SOURCES.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return "code_repo@" + digest.hexdigest()[:16]


@dataclass
class RegradeReport:
    run_id: int
    grader: str
    episodes: list[Regraded] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)

    @property
    def changed(self) -> list[Regraded]:
        return [e for e in self.episodes if e.changed]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return changed_steps(self.episodes)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "grader": self.grader, "regraded": len(self.episodes),
                "changed": [e.as_dict() for e in self.changed], "steps": self.steps, "skipped": dict(self.skipped)}


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """`A..B` (inclusive), `A..` or `..B`; None for every step."""
    if not text:
        return None
    first, sep, last = text.partition("..")
    try:
        bounds = (int(first) if first else 0, int(last) if last else 2**62) if sep else (int(text), int(text))
    except ValueError:
        raise ConfigError(f"--steps: expected A..B, A.. or ..B with step numbers, got {text[:40]!r}") from None
    if bounds[0] < 0 or bounds[0] > bounds[1]:
        raise ConfigError(f"--steps: expected 0 ≤ A ≤ B, got {text[:40]!r}")
    return bounds


def regrade_run(session: Session, *, run_id: int, sandboxes: SandboxProvider,
                steps: tuple[int, int] | None = None, limit: int | None = None) -> RegradeReport:
    if session.get(Run, run_id) is None:
        raise NotFound(f"run {run_id}: expected an existing run, got none")
    query = (select(Episode, EpisodeGroup.consumed_step).join(EpisodeGroup, EpisodeGroup.id == Episode.group_id)
             .where(Episode.run_id == run_id, Episode.status == "completed").order_by(Episode.id))
    if steps is not None:
        query = query.where(EpisodeGroup.consumed_step.between(*steps))
    report = RegradeReport(run_id=run_id, grader=grader_version())
    for episode, step in session.execute(query.limit(limit)).all():
        regrade = _regrade(session, episode, sandboxes=sandboxes, report=report)
        if regrade is None:
            continue
        session.add(regrade)
        session.commit()
        report.episodes.append(Regraded(episode.id, step if episode.advantage is not None else None, episode.reward,
                                        regrade.reward, sorted(episode.flags or []), sorted(regrade.flags)))
    return report


def _regrade(session: Session, episode: Episode, *, sandboxes: SandboxProvider,
             report: RegradeReport) -> EpisodeRegrade | None:
    env_row = session.get(Environment, episode.environment_id)
    task_row = session.get(Task, episode.task_id)
    if env_row is None or task_row is None or env_row.kind != CodeRepoKind.name:
        report.skipped["not a code_repo episode"] += 1
        return None
    if not episode.final_diff:
        report.skipped["no stored submission"] += 1
        return None
    spec = spec_of(env_row)
    if spec.verifier.judge is not None or spec.verifier.reward_model is not None:
        report.skipped["a learned layer (judge, reward model) is not re-graded here"] += 1
        return None
    kind = get_kind(spec.kind)(spec)
    task = kind.parse_task(task_row.payload)  # as the runner does
    try:
        task, spec = prepare_task(kind, task, spec=spec, sandboxes=sandboxes, run_id=episode.run_id,
                                  episode_id=episode.id)
    except (CrucibleError, RuntimeError) as error:
        report.skipped[f"task refused: {str(error)[:80]}"] += 1
        return None
    turns = session.execute(select(Turn.tool_call).where(Turn.run_id == episode.run_id, Turn.episode_id == episode.id)
                            .order_by(Turn.index)).scalars()
    actions = [ToolCall(call["name"], call.get("arguments", {})) for call in turns if isinstance(call, dict)]
    def fresh() -> Any:
        return sandboxes.fresh(spec=spec, run_id=episode.run_id, episode_id=episode.id)

    with fresh() as replay:
        kind.setup(sandbox=replay, task=task)
        failure = repo.apply_patch(replay, episode.final_diff, name="stored submission")
        if failure:
            report.skipped["the stored diff does not apply to its base"] += 1
            return None
        try:
            verdict = kind.verify(sandbox=replay, task=task, submitted=episode.termination_reason == "submitted",
                                  open_sandbox=fresh, actions=actions)
        except GraderFault as fault:
            report.skipped[f"grader fault: {str(fault)[:80]}"] += 1
            return None
    reward = total(verdict.layers, verdict.flags, spec).value
    return EpisodeRegrade(run_id=episode.run_id, episode_id=episode.id, grader=report.grader, reward=reward,
                          reward_components=verdict.components,
                          verifier_layers=[layer_record(layer) for layer in verdict.layers], flags=list(verdict.flags),
                          previous_reward=episode.reward)
