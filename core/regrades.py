"""What a re-grade changed (one definition for `crucible episodes regrade` and `GET /v1/runs/{id}/grading`):
an episode changed when its reward moved or its flags differ; a training step is named when it consumed a
changed episode, with how many and by how much (Σ re-graded − trained-on reward)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

CHANGE = 1e-9


@dataclass(frozen=True)
class Regraded:
    episode_id: int
    step: int | None
    """The training step that consumed the episode's group (None: not trained on)."""
    before: float | None
    """The reward it was stored (and trained) with."""
    after: float
    flags_before: list[str]
    flags_after: list[str]

    @property
    def delta(self) -> float:
        return self.after - (self.before or 0.0)

    @property
    def changed(self) -> bool:
        return abs(self.delta) > CHANGE or sorted(self.flags_after) != sorted(self.flags_before)

    def as_dict(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "step": self.step, "before": self.before, "after": self.after,
                "flags_before": self.flags_before, "flags_after": self.flags_after}


def changed_steps(regraded: Iterable[Regraded]) -> list[dict[str, Any]]:
    """Per step that trained on a changed episode, in step order: {step, episodes, reward_change}."""
    steps: dict[int, dict[str, Any]] = {}
    for episode in regraded:
        if episode.changed and episode.step is not None:
            row = steps.setdefault(episode.step, {"step": episode.step, "episodes": [], "reward_change": 0.0})
            row["episodes"].append(episode.episode_id)
            row["reward_change"] += episode.delta
    return [steps[step] for step in sorted(steps)]
