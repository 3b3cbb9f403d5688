"""The trainer's ranks: how one step's micro-batches are shared out and its statistics summed back.

Every rank holds the whole batch (rank 0 claims it and broadcasts it), so every rank computes the same
token totals and the same loss normalisation; rank r runs micro-batches r, r+W, r+2W, … of each
optimizer step. DeepSpeed averages gradients over the W ranks, so each rank's loss is scaled by W: the
summed gradient is the one-rank gradient of the same batch. A rank with fewer micro-batches than the
others runs padding (its first micro-batch again, weight 0): under ZeRO-3 every forward and backward is
collective, so every rank must run as many.

    ranks = Ranks.current()                 # None on one rank
    for batch, weight in share(batches, ranks): ...
    ranks.reduce_stats(stats)               # sums, and the extremes of *_max / *_min
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from trainer.engine import PolicyEngine
from trainer.loss import merge_stats

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int

    @staticmethod
    def current() -> Ranks | None:
        """This process's place in the initialised process group; None without one or with one rank."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return None
        return Ranks(rank=dist.get_rank(), world=dist.get_world_size())

    def reduce_stats(self, stats: dict[str, float]) -> dict[str, float]:
        """Every rank's stats combined as trainer.loss.merge_stats combines micro-batches'; the same
        result on every rank (a key one rank lacks is merged from the others alone)."""
        gathered: list[dict[str, float] | None] = [None] * self.world
        dist.all_gather_object(gathered, stats)
        out: dict[str, float] = {}
        for part in gathered:
            merge_stats(out, part or {})
        return out

    def all_finite(self, value: torch.Tensor) -> bool:
        """Whether `value` is finite on every rank (all ranks skip a step together, never one alone)."""
        flag = torch.tensor([1.0 if bool(torch.isfinite(value.detach()).all()) else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item() == 1.0)


def share(batches: Sequence[T], ranks: Ranks | None) -> list[tuple[T, float]]:
    """This rank's (micro-batch, weight) pairs of one optimizer step: every W-th from its rank on, padded
    with (the first one, weight 0) to as many as the busiest rank runs. One rank: all, weight 1."""
    if ranks is None:
        return [(batch, 1.0) for batch in batches]
    if not batches:
        raise ValueError("share: expected at least one micro-batch per optimizer step, got none")
    mine = [(batch, 1.0) for batch in batches[ranks.rank::ranks.world]]
    most = -(-len(batches) // ranks.world)
    return mine + [(batches[0], 0.0)] * (most - len(mine))


# ---- the step protocol: rank 0 leads, the others follow -----------------------------------------
# Rank 0 is the trainer of trainer.loop (database, checkpoints' bookkeeping, weight sync); ranks 1…W−1
# hold their shard of the ZeRO engine and do what rank 0 announces, in the same order, so that every
# collective (a ZeRO-3 forward, a checkpoint save, a weight gather) is entered by every rank.
INIT, UPDATE, SAVE, LOAD, EXPORT, REBUILD, STOP = "init", "update", "save", "load", "export", "rebuild", "stop"


def announce(command: str, payload: Any = None) -> None:
    """Rank 0: tell every other rank what to do next (a pickled broadcast)."""
    dist.broadcast_object_list([(command, payload)], src=0)


def leave() -> None:
    """Every rank, at its end: wait for the others, then tear the process group down (a process that
    exits with the group up can abort in gloo's threads: "terminate called without an active exception")."""
    dist.barrier()
    dist.destroy_process_group()


def receive() -> tuple[str, Any]:
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0)
    command, payload = box[0]
    return command, payload


class LeaderEngine:
    """Rank 0's engine: each call every rank must make (save, load, a weight gather) is announced to the
    followers first; forward, backward and step run inside `update`, which the followers mirror."""

    def __init__(self, inner: PolicyEngine) -> None:
        self.inner = inner
        self.module = inner.module

    def __call__(self, **inputs: Any) -> Any:
        return self.inner(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        self.inner.backward(loss)

    def step(self) -> float:
        return self.inner.step()

    def lr(self) -> float:
        return self.inner.lr()

    def save(self, directory: Path) -> None:
        announce(SAVE, str(directory))
        self.inner.save(directory)
        dist.barrier()  # every rank's shard is on disk before rank 0 fsyncs and renames the directory

    def load(self, directory: Path) -> None:
        announce(LOAD, str(directory))
        self.inner.load(directory)

    @contextmanager
    def full_weights(self) -> Iterator[torch.nn.Module]:
        announce(EXPORT)
        with self.inner.full_weights() as module:
            yield module

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        announce(EXPORT)
        return self.inner.export_state_dict()


@dataclass(frozen=True)
class FollowerSetup:
    """What rank 0 sends with INIT: enough for a follower to build the same engine and run `update`."""

    model_dir: str
    config: dict[str, Any]
    temperature: float


def follow(*, build: Callable[[FollowerSetup], tuple[PolicyEngine, torch.nn.Module | None]]) -> int:
    """A follower rank's whole life: build the engine when rank 0 says INIT, then run what it announces
    until STOP. `build` returns the engine and the KL reference model (or None). Returns the updates run."""
    from trainer import faults
    from trainer.config import TrainerConfig
    from trainer.errors import NonFiniteStep
    from trainer.step import update

    engine: PolicyEngine | None = None
    reference: torch.nn.Module | None = None
    setup: FollowerSetup | None = None
    config: TrainerConfig | None = None
    updates = 0
    while True:
        command, payload = receive()
        if command in (INIT, REBUILD):
            if command == INIT:
                setup, config = payload, TrainerConfig.model_validate(payload.config)
            assert setup is not None
            engine, reference = build(setup)
            continue
        if command == STOP:
            leave()
            return updates
        assert engine is not None and setup is not None and config is not None, \
            f"rank {dist.get_rank()}: {command} before {INIT}"
        if command == UPDATE:
            step, samples = payload
            try:
                update(engine, samples, config=config, temperature=setup.temperature, reference=reference)
                updates += 1
            except NonFiniteStep:  # every rank raised it together (Ranks.all_finite, the global norm)
                pass
            faults.crash_point("update", step=step)
        elif command == SAVE:
            engine.save(Path(payload))
            dist.barrier()
        elif command == LOAD:
            engine.load(Path(payload))
        elif command == EXPORT:
            with engine.full_weights():
                pass
        else:
            raise ValueError(f"rank {dist.get_rank()}: expected one of {INIT}, {UPDATE}, {SAVE}, {LOAD}, {EXPORT}, "
                             f"{REBUILD}, {STOP} from rank 0, got {command!r}")
