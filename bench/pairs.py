"""Paired, interleaved measurements: the statistics every comparative benchmark here reports.

    runs = interleave(pairs=5, sides={"ours": run_ours, "trl": run_trl})   # ABBA… in one process
    summary = paired_summary(runs["ours"], runs["trl"], key="tokens_per_s")

Each pair measures both sides back to back, the order alternating (A then B, then B then A …) so that
a drift of the machine's load during the run (other processes, thermal state) falls on both sides
alike. The figure quoted is the median of the per-pair ratios, with their min and max: the spread a
rerun is expected to land in.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any


def interleave(*, pairs: int, sides: dict[str, Callable[[], dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Run each side once per pair, alternating which goes first; each side's results in pair order."""
    if pairs < 1:
        raise ValueError(f"pairs: expected at least 1, got {pairs}")
    if len(sides) != 2:
        raise ValueError(f"sides: expected exactly 2, got {len(sides)}")
    names = list(sides)
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for index in range(pairs):
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            result = sides[name]()
            result["pair"], result["position"] = index, order.index(name)
            out[name].append(result)
    return out


def paired_summary(a: list[dict[str, Any]], b: list[dict[str, Any]], *, key: str) -> dict[str, Any]:
    """Ratio a[key] / b[key] per pair: median, min, max; and each side's p50 (median) of `key`."""
    if len(a) != len(b) or not a:
        raise ValueError(f"expected the same non-zero number of results per side, got {len(a)} and {len(b)}")
    ratios = [x[key] / y[key] for x, y in zip(a, b, strict=True)]
    return {"ratio_median": round(statistics.median(ratios), 3), "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3), "ratios": [round(r, 3) for r in ratios], "pairs": len(ratios),
            "a_p50": statistics.median(x[key] for x in a), "b_p50": statistics.median(y[key] for y in b)}
