"""The weight version of every sampled token, run-length encoded: [v₀, n₀, v₁, n₁, …].

    encode([3, 3, 3, 4, 4]) == [3, 3, 4, 2]
    decode([3, 3, 4, 2]) == [3, 3, 3, 4, 4]

A completion that spans a weight sync (vLLM keeps in-flight requests across it) has two runs; one
sampled under a single version has one. Versions never go back within a completion.
"""

from __future__ import annotations

from collections.abc import Sequence


def encode(versions: Sequence[int]) -> list[int]:
    runs: list[int] = []
    for version in versions:
        if runs and runs[-2] == version:
            runs[-1] += 1
        else:
            runs += [version, 1]
    return runs


def decode(runs: Sequence[int], *, length: int | None = None) -> list[int]:
    """One version per token; ValueError for a malformed encoding or one of another `length`."""
    if len(runs) % 2:
        raise ValueError(f"version runs: expected (version, count) pairs, got {len(runs)} integers")
    out: list[int] = []
    for version, count in zip(runs[::2], runs[1::2], strict=True):
        if count < 1 or version < 0:
            raise ValueError(f"version runs: expected a version ≥ 0 and a count ≥ 1, got ({version}, {count})")
        out += [version] * count
    if length is not None and len(out) != length:
        raise ValueError(f"version runs: expected {length} tokens, got {len(out)}")
    if out != sorted(out):
        raise ValueError(f"version runs: versions must not go back within a completion, got {list(runs)}")
    return out


def from_spans(spans: Sequence[tuple[int, int, int]], *, length: int) -> list[int]:
    """(version, start, end) spans over a completion's `length` tokens → runs. The spans must cover
    every token exactly once, in order (ValueError otherwise: the labels could not be trusted)."""
    runs: list[int] = []
    position = 0
    for version, start, end in spans:
        if start != position or end <= start:
            raise ValueError(f"weight-version spans: expected a span starting at token {position}, got "
                             f"[{start}, {end}) in {list(spans)}")
        runs += [version, end - start]
        position = end
    if position != length:
        raise ValueError(f"weight-version spans: expected them to cover {length} tokens, they cover {position}")
    return encode(decode(runs))
