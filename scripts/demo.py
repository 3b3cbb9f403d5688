"""`make demo`: watch a tiny model learn a multi-turn tool task with real RL on this machine.

    scripts/demo.sh                                  # = .venv/bin/python scripts/demo.py
    .venv/bin/python scripts/demo.py --rl-minutes 5 --seed 0

On the embedded default (no CRUCIBLE_DATABASE_URL: embedded Postgres, Celery on its SQLAlchemy
transport): builds the sandbox images, makes a tiny model (`crucible model init-tiny`), warms it up
with a short SFT on synthetic demonstrations, then runs real RL — controller + task worker (Docker
sandboxes) + trainer + vLLM on CPU — on the `read_number` environment (read a file, submit the
number it holds), printing a live view of the steps and the held-out success rate before and
after. The runs stay in the store (`crucible run ls`). The steps live in `cli/demo.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":
    import logging

    import typer

    from cli.demo import demo

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(demo)
