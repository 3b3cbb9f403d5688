"""Sampling seeds. A run's seed (`RunConfig.seed`) fixes the seed of every request its episodes send to
vLLM: the same seed, weights and task give the same episode; another sample of the group, another turn
or another seed, other draws.

    base = episode_seed(run_seed=0, group_index=3, sample_index=1)
    turn_seed(base, turn=2, attempt=0)           # what the episode's third turn sends as `seed`
"""

from __future__ import annotations

import hashlib

BITS = 31
"""vLLM takes any int; 31 bits keep it a positive C int everywhere."""


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") % (1 << BITS)


def episode_seed(*, run_seed: int, group_index: int, sample_index: int) -> int:
    """The seed of one episode: its run's seed and its place in the run (group, sample), never a row id."""
    return _hash(f"episode:{run_seed}:{group_index}:{sample_index}")


def turn_seed(base: int, *, turn: int, attempt: int = 0) -> int:
    """The seed of an episode's `turn` (0-based); `attempt` > 0 when the turn is sampled again."""
    return _hash(f"turn:{base}:{turn}:{attempt}")
