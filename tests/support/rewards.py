"""That a stored episode's reward is derived, never accumulated: `environments.rewards.total` of its stored
layers (`verifier_layers`) and flags under its environment's spec. Each kind's episode tests call it on
the episodes they played, as do the pairwise judge's (issue 49: one derivation of the reward)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy.orm import Session

from core.models import Environment, Episode
from core.termination import EpisodeStatus
from environments.rewards import total
from environments.service import spec_of


def assert_reward_derived(session: Session, episode_ids: Iterable[int]) -> None:
    """Each completed episode's stored reward equals `total` of its stored layers and flags, exactly."""
    session.expire_all()
    checked = 0
    for episode_id in episode_ids:
        episode = session.get(Episode, episode_id)
        assert episode is not None, episode_id
        if episode.status != EpisodeStatus.COMPLETED:
            continue
        environment = session.get(Environment, episode.environment_id)
        assert environment is not None
        layers = {layer["name"]: layer["score"] for layer in episode.verifier_layers}
        assert layers == episode.reward_components, (episode_id, episode.verifier_layers)
        derived = total(layers, episode.flags or [], spec_of(environment))
        assert episode.reward == derived.value, (episode_id, episode.reward, derived, episode.flags)
        checked += 1
    assert checked, "no completed episode to check"
