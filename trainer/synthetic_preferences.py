"""A seeded synthetic preference set whose rule a tiny reward model can learn: the preferred response
gives the number the prompt asks for, the rejected one a different number, in the same words.

    python -m trainer.synthetic_preferences prefs.jsonl --pairs 600 --seed 0
    crucible rm train --pairs prefs.jsonl --model tiny --out rm

Both responses of a pair share their template and length, so nothing but the number separates them:
a reward model that scores above chance on held-out pairs has learned to compare the response with
the prompt, not a surface feature of one side.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from trainer.preference_pairs import PreferencePair

PROMPTS = (
    "Reply with the number {n}.",
    "Please say {n}.",
    "What number comes after {p}?",
    "Give me the number {n}, nothing else.",
    "Count to {n} and tell me where you stopped.",
)
RESPONSES = (
    "{n}",
    "The number is {n}.",
    "Sure: {n}.",
    "I stopped at {n}.",
    "Here it is, {n}.",
)


def make_pairs(count: int, *, seed: int = 0, largest: int = 9) -> list[PreferencePair]:
    """`count` pairs; numbers from 1 to `largest`; same seed → the same pairs."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        wanted = rng.randint(1, largest)
        wrong = rng.choice([k for k in range(1, largest + 1) if k != wanted])
        prompt = rng.choice(PROMPTS).format(n=wanted, p=wanted - 1)
        template = rng.choice(RESPONSES)
        pairs.append(PreferencePair(prompt=prompt, chosen=template.format(n=wanted),
                                    rejected=template.format(n=wrong)))
    return pairs


def write_jsonl(pairs: list[PreferencePair], path: Path) -> None:
    path.write_text("".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n"
                            for p in pairs))


if __name__ == "__main__":
    args = sys.argv[1:]
    out = Path(args[0]) if args else Path("prefs.jsonl")
    n = int(args[args.index("--pairs") + 1]) if "--pairs" in args else 600
    s = int(args[args.index("--seed") + 1]) if "--seed" in args else 0
    write_jsonl(make_pairs(n, seed=s), out)
