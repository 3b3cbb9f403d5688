"""The weight-version labels a policy server carries, as the trainer sets them and workers read them.

    "7"             weights of policy version 7, verified by the probe
    "7-unverified"  weights for version 7 loaded, the probe not passed (yet): provisional
    "default"       vLLM's own label before any update (a fresh or restarted server): no known version
"""

from __future__ import annotations

UNVERIFIED_SUFFIX = "-unverified"


def unverified_tag(version: int) -> str:
    """The provisional label of weights loaded for `version` while the probe checks them."""
    return f"{version}{UNVERIFIED_SUFFIX}"


def parse_label(label: str | None, *, now: str | None) -> int | None:
    """The verified version a label stands for; None when it names none. A provisional "N-unverified"
    counts as N once the server has moved on to a verified N or later (`now`: its label read after
    the fact); had the probe failed, the server would be back on the previous version."""
    if label is not None and label.endswith(UNVERIFIED_SUFFIX):
        provisional = label.removesuffix(UNVERIFIED_SUFFIX)
        verified = now is not None and now.isdigit() and provisional.isdigit() and int(now) >= int(provisional)
        return int(provisional) if verified else None
    return int(label) if label is not None and label.isdigit() else None
