"""A tiny reward model and `crucible rm serve` run for real (a subprocess), for tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from core.health import wait_healthy
from core.net import free_port
from trainer.reward_model import FORMAT, load_base, save_reward_model
from trainer.tiny_model import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
SERVED: dict[str, int] = {}
"""API root → pid of each `crucible rm serve` serve_reward_model runs now."""


def make_reward_model(directory: Path) -> Path:
    """A tiny reward model (seeded trunk and head, untrained: for serving, not learning) at directory/rm."""
    base = make_tiny_model(out_dir=directory / "base", seed=0).path
    torch.manual_seed(0)
    model, tokenizer = load_base(base)
    out = directory / "rm"
    save_reward_model(model, tokenizer, out_dir=out, config={"format": FORMAT, "base_model": str(base),
                                                             "max_tokens": 256})
    return out


@contextmanager
def serve_reward_model(reward_model_dir: Path) -> Iterator[str]:
    """`crucible rm serve DIR` on a free port until the block ends; yields its API root (…/v1). A bearer
    token of the test store is made and set as this process's CRUCIBLE_API_TOKEN meanwhile (what a
    worker sends the server), so the `reward_model` layer scoring here is let in."""
    from api.services.tokens import create_token
    from core.db import session_scope
    from core.settings import get_settings

    with session_scope() as session:
        _, token = create_token(session, name=f"reward model {reward_model_dir.name}")
    previous = os.environ.get("CRUCIBLE_API_TOKEN")
    os.environ["CRUCIBLE_API_TOKEN"] = token
    get_settings.cache_clear()
    port = free_port()
    child = subprocess.Popen([sys.executable, "-m", "cli.main", "rm", "serve", str(reward_model_dir), "--port", str(port)],
                             cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(f"{url}/health", alive=lambda: child.poll() is None, timeout_s=120, what="crucible rm serve")
        except RuntimeError as error:
            raise RuntimeError(f"{error}: {child.stderr.read().decode()[-2000:]}") from None  # type: ignore[union-attr]
        SERVED[f"{url}/v1"] = child.pid
        yield f"{url}/v1"
    finally:
        SERVED.pop(f"{url}/v1", None)
        child.terminate()
        child.wait(30)
        if previous is None:
            os.environ.pop("CRUCIBLE_API_TOKEN", None)
        else:
            os.environ["CRUCIBLE_API_TOKEN"] = previous
        get_settings.cache_clear()
