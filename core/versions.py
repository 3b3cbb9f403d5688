"""The weight labels a policy server carries, as the trainer sets them and workers read them.

    "r12:7#3fa9c2d1"             run 12's version 7, the load 3fa9c2d1 of it, verified by the probe
    "r12:7-unverified#3fa9c2d1"  the same load while the probe checks it: provisional
    "1000004242#0c1d2e3f"        a checkpoint evaluation's weights (no run: `checkpoint_tag()`)
    "default"                    vLLM's own label before any update (a fresh or restarted server): no version

A label names the training run whose trainer pushed the weights: every run numbers its versions 0, 1, 2,
… and a bare number could be any run's. A worker of a training run refuses a label of another run
(`LabelState.FOREIGN`): tokens sampled by another run's weights never train this one. A label that names
no run (a server no Crucible trainer tagged, the tests' scripted server) is taken at its word; the
trainer still refuses a token newer than its own version.

Every load carries a nonce of its own, so a provisional label settles for that load alone (`settle`):
verified once that load is seen committed — the server says so now, or a later span of the same
completion was sampled under its committed label (a long completion that straddles the commit and
the next push) — pending while the server still says the provisional label, failed once it says
anything else: a rollback, a restart, or a later load, which the worker cannot tell apart from a
re-push of the same version after a failed probe. Failed only costs a resampled turn: nothing
sampled by rejected weights is ever stored.

A label at or above CHECKPOINT_TAG_BASE that names no run is a checkpoint evaluation's: a training
run's worker refuses it as foreign.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, replace
from enum import StrEnum

CHECKPOINT_TAG_BASE = 1_000_000_000
"""Weights a checkpoint's evaluation loads are tagged at or above this, never a training version (a
step number): `checkpoint_tag()`."""
UNVERIFIED_SUFFIX = "-unverified"
_LABEL = re.compile(r"(?:r(?P<run>[1-9][0-9]{0,17}):)?(?P<version>0|[1-9][0-9]{0,17})"
                    r"(?P<provisional>-unverified)?(?:#(?P<load>[0-9a-f]{8}))?", re.ASCII)


def checkpoint_tag() -> int:
    """A fresh label for one evaluation's checkpoint weights: CHECKPOINT_TAG_BASE + a random number below
    it, so that no training run's version (every fresh trainer publishes 0, 1, 2, …) and, but for a
    one-in-10⁹ draw, no other evaluation's label is the same."""
    return CHECKPOINT_TAG_BASE + secrets.randbelow(CHECKPOINT_TAG_BASE)


@dataclass(frozen=True)
class Label:
    """One weight label: whose weights (`run`), which version, which load of it, verified or not."""

    version: int
    run: int | None = None
    """The training run whose trainer pushed them; None for a checkpoint evaluation's or an unscoped label."""
    load: str | None = None
    """The load's nonce (8 hex digits): a version pushed twice (a probe failed, then a retry) is two loads."""
    provisional: bool = False

    @classmethod
    def fresh(cls, version: int, *, run: int | None) -> Label:
        """The provisional label of a new load of `version`."""
        return cls(version=version, run=run, load=secrets.token_hex(4), provisional=True)

    @classmethod
    def parse(cls, text: str | None) -> Label | None:
        """The label `text` spells, or None ("default", nothing, garbage)."""
        match = _LABEL.fullmatch(text) if text is not None else None
        if match is None:
            return None
        run = match["run"]
        return cls(version=int(match["version"]), run=None if run is None else int(run), load=match["load"],
                   provisional=match["provisional"] is not None)

    @property
    def committed(self) -> Label:
        """The same load once its probe passed."""
        return replace(self, provisional=False)

    def __str__(self) -> str:
        scope = "" if self.run is None else f"r{self.run}:"
        load = "" if self.load is None else f"#{self.load}"
        return f"{scope}{self.version}{UNVERIFIED_SUFFIX if self.provisional else ''}{load}"


class LabelState(StrEnum):
    VERIFIED = "verified"  # verified weights of `version`
    PENDING = "pending"  # provisional, its probe not decided yet: ask again later
    FAILED = "failed"  # provisional, and the server no longer holds that load committed or on probe: not kept
    FOREIGN = "foreign"  # another training run's weights
    UNKNOWN = "unknown"  # no version (a restarted server's "default", nothing reported, garbage)


@dataclass(frozen=True)
class Settled:
    state: LabelState
    version: int | None = None
    """The verified version (VERIFIED only)."""
    run: int | None = None
    """The run a FOREIGN label names."""


def settle(label: str | None, *, now: str | None, run: int | None = None, seen: frozenset[str] = frozenset()
           ) -> Settled:
    """What `label` stands for, given the server's label `now` (read after the fact) and the labels
    `seen` on the same completion, for a worker of training run `run` (None: any run's label is read
    for what it says, to be shown)."""
    parsed = Label.parse(label)
    if parsed is None:
        return Settled(LabelState.UNKNOWN)
    if run is not None and parsed.run is not None and parsed.run != run:
        return Settled(LabelState.FOREIGN, run=parsed.run)
    if run is not None and parsed.run is None and parsed.version >= CHECKPOINT_TAG_BASE:
        return Settled(LabelState.FOREIGN)  # a checkpoint evaluation's weights
    if not parsed.provisional:
        return Settled(LabelState.VERIFIED, parsed.version)
    if parsed.load is None:  # a provisional label must name its load: nothing could settle it
        return Settled(LabelState.UNKNOWN)
    if str(parsed.committed) in seen:  # the completion went on under that load, committed
        return Settled(LabelState.VERIFIED, parsed.version)
    current = Label.parse(now)
    if current is None and now is None:  # nothing reported (yet): ask again
        return Settled(LabelState.PENDING)
    if current is not None and current.committed == parsed.committed:
        return Settled(LabelState.PENDING) if current.provisional else Settled(LabelState.VERIFIED, parsed.version)
    return Settled(LabelState.FAILED)


def parse_label(label: str | None, *, now: str | None, run: int | None = None) -> int | None:
    """The verified version a label stands for, or None (pending, failed, foreign or unknown)."""
    return settle(label, now=now, run=run).version
