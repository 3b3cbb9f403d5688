"""Checkpoints written atomically, in two phases that bracket the database commit of a step.

    root/step-000007/           a complete checkpoint (engine state + trainer_state.json + rng.pt)
    root/step-000008.pending/   written before step 8's transaction commits
    root/.tmp-step-000008-PID/  being written (ignored and removed on start)

A step writes its checkpoint as `.pending` (temp dir, fsync, rename), commits the step in the
database, then promotes the checkpoint (rename). On restart a pending checkpoint is promoted if the
database recorded its step, else discarded — so the newest checkpoint always matches the newest
recorded step, and the groups it consumed are exactly those the database marks consumed.

A checkpoint also holds this process's random generators (torch's, CUDA's, Python's, numpy's): with
dropout on (LoRA's) a step draws from them, and a run resumed from a checkpoint must draw what the
uninterrupted run would have drawn.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy
import torch

from core.durable import fsync_path
from trainer.engine import PolicyEngine

log = logging.getLogger(__name__)
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.pt"
_NAME = re.compile(r"^step-(\d{6,})(\.pending)?$")


@dataclass(frozen=True)
class TrainerState:
    """What a checkpoint records beside the weights and optimizer."""

    run_id: int
    step: int
    policy_version: int
    """The version this step's weights are published as."""
    consumed_groups: int
    """Watermark: groups the run had consumed through this step (the database must agree)."""
    last_group_ids: list[int] = field(default_factory=list)
    """The groups this step consumed."""


def rng_state() -> dict[str, Any]:
    """Every random generator a step may draw from, as tensors and plain values (`torch.load` reads them
    with `weights_only`)."""
    legacy = cast(tuple[str, numpy.ndarray, int, int, float], numpy.random.get_state(legacy=True))
    kind, keys, position, has_gauss, gauss = legacy  # (MT19937, (624,) uint32 key, position, Gaussian cache)
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "python": random.getstate(),
            "numpy": (kind, torch.from_numpy(keys.astype(numpy.int64)), position, has_gauss, gauss)}


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    kind, keys, position, has_gauss, gauss = state["numpy"]
    numpy.random.set_state((kind, keys.numpy().astype(numpy.uint32), position, has_gauss, gauss))


def _fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    fsync_path(directory)


def complete_steps(root: Path) -> list[int]:
    """The steps of the complete checkpoints under `root`, ascending (none when it cannot be read)."""
    try:
        names = [_NAME.match(path.name) for path in Path(root).iterdir()]
    except OSError:
        return []
    return sorted(int(match.group(1)) for match in names if match and not match.group(2))


class CheckpointStore:
    def __init__(self, root: Path, *, keep: int = 2, keep_every: int | None = None) -> None:
        """`keep`: the newest checkpoints kept; `keep_every`: every checkpoint whose step is a multiple
        of it is kept too (for evaluating checkpoints later: `crucible eval launch --run R --step S`)."""
        self.root = Path(root)
        self.keep = keep
        self.keep_every = keep_every
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)  # a write that a crash interrupted

    def _path(self, step: int, *, pending: bool) -> Path:
        return self.root / f"step-{step:06d}{'.pending' if pending else ''}"

    def _steps(self, *, pending: bool) -> list[int]:
        found = []
        for path in self.root.iterdir():
            match = _NAME.match(path.name)
            if match and bool(match.group(2)) == pending:
                found.append(int(match.group(1)))
        return sorted(found)

    def write_pending(self, *, engine: PolicyEngine, state: TrainerState) -> Path:
        """Engine state + trainer state into `step-N.pending`, atomically."""
        tmp = self.root / f".tmp-step-{state.step:06d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        engine.save(tmp)
        torch.save(rng_state(), tmp / RNG_FILE)
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2) + "\n")
        _fsync_tree(tmp)
        target = self._path(state.step, pending=True)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
        fsync_path(self.root)
        return target

    def promote(self, step: int) -> Path:
        """`step-N.pending` → `step-N`; then delete all but the newest `keep` checkpoints and the
        `keep_every`-th."""
        final = self._path(step, pending=False)
        os.rename(self._path(step, pending=True), final)
        fsync_path(self.root)
        for old in self._steps(pending=False)[: -self.keep]:
            if not (self.keep_every and old % self.keep_every == 0):
                shutil.rmtree(self._path(old, pending=False), ignore_errors=True)
        return final

    def discard_pending(self, step: int) -> None:
        shutil.rmtree(self._path(step, pending=True), ignore_errors=True)

    def pending_steps(self) -> list[int]:
        return self._steps(pending=True)

    @staticmethod
    def load(path: Path, *, engine: PolicyEngine) -> None:
        """The checkpoint at `path` into `engine` (weights, optimizer, schedule) and into this process's
        random generators. A checkpoint written before they were saved loads without them (logged)."""
        engine.load(path)
        if (path / RNG_FILE).is_file():
            set_rng_state(torch.load(path / RNG_FILE, weights_only=True))
        else:
            log.warning("checkpoint %s holds no random generator state: a step with dropout will not draw "
                        "what the uninterrupted run drew", path)

    def latest(self) -> tuple[Path, TrainerState] | None:
        steps = self._steps(pending=False)
        if not steps:
            return None
        path = self._path(steps[-1], pending=False)
        return path, TrainerState(**json.loads((path / STATE_FILE).read_text()))

    def reconcile(self, *, recorded_step: int) -> None:
        """Promote the pending checkpoint of a step the database recorded; discard the others."""
        for step in self.pending_steps():
            if step == recorded_step and step not in self._steps(pending=False):
                self.promote(step)
            else:
                self.discard_pending(step)
