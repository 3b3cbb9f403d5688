"""The weight-version labels a policy server carries, as the trainer sets them and workers read them.

    "7"             weights of policy version 7, verified by the probe
    "7-unverified"  weights for version 7 loaded, the probe not passed (yet): provisional
    "default"       vLLM's own label before any update (a fresh or restarted server): no known version

A provisional label is settled by what the server says afterwards (`settle`): verified once it serves a
verified 7 or later (the trainer pushes 8 only after publishing 7), failed once it is back on 6 (the
probe failed and rolled back), still pending while it says "7-unverified".
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from enum import StrEnum

UNVERIFIED_SUFFIX = "-unverified"
CHECKPOINT_TAG_BASE = 1_000_000_000
"""Weights a checkpoint's evaluation loads are tagged at or above this, never a training version (a
step number): `checkpoint_tag()`."""


def checkpoint_tag() -> int:
    """A fresh label for one evaluation's checkpoint weights: CHECKPOINT_TAG_BASE + a random number below
    it, so that no training run's version (every fresh trainer publishes 0, 1, 2, …) and, but for a
    one-in-10⁹ draw, no other evaluation's label is the same."""
    return CHECKPOINT_TAG_BASE + secrets.randbelow(CHECKPOINT_TAG_BASE)


def unverified_tag(version: int) -> str:
    """The provisional label of weights loaded for `version` while the probe checks them."""
    return f"{version}{UNVERIFIED_SUFFIX}"


class LabelState(StrEnum):
    VERIFIED = "verified"  # the label names verified weights of `version`
    PENDING = "pending"  # provisional, its probe not decided yet: ask again later
    FAILED = "failed"  # provisional weights whose probe failed: what they sampled must not be kept
    UNKNOWN = "unknown"  # no version (a restarted server's "default", nothing reported, garbage)


@dataclass(frozen=True)
class Settled:
    state: LabelState
    version: int | None = None
    """The verified version (VERIFIED only)."""


def _number(label: str | None) -> int | None:
    return int(label) if label is not None and label.isascii() and label.isdigit() else None


def settle(label: str | None, *, now: str | None) -> Settled:
    """What `label` stands for, given the server's label `now` (read after the fact)."""
    if label is not None and label.endswith(UNVERIFIED_SUFFIX):
        provisional = _number(label.removesuffix(UNVERIFIED_SUFFIX))
        if provisional is None:
            return Settled(LabelState.UNKNOWN)
        current = _number(now)
        later = _number(now.removesuffix(UNVERIFIED_SUFFIX)) if now is not None and now.endswith(
            UNVERIFIED_SUFFIX) else None
        if (current is not None and current >= provisional) or (later is not None and later > provisional):
            return Settled(LabelState.VERIFIED, provisional)
        if current is not None:  # back on an older version: the probe failed and the server rolled back
            return Settled(LabelState.FAILED)
        if later == provisional:
            return Settled(LabelState.PENDING)
        return Settled(LabelState.UNKNOWN)
    version = _number(label)
    return Settled(LabelState.VERIFIED, version) if version is not None else Settled(LabelState.UNKNOWN)


def parse_label(label: str | None, *, now: str | None) -> int | None:
    """The verified version a label stands for, or None (pending, failed or unknown)."""
    return settle(label, now=now).version
