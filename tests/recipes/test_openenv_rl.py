"""`make rl-openenv`, CI-sized: one GRPO run over two OpenEnv environments from PyPI (recipes/openenv_rl.py).

Real everything: the OpenEnv images built from PyPI wheels, each environment's own server in a Docker
sandbox with no network, vLLM on CPU, a task worker on the `openenv` queue and the controller as child
processes, a GRPO trainer process that must publish steps made of both environments' groups.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Environment, Episode, EpisodeGroup, Run, TrainingStep
from recipes.openenv_rl import DIPG_ENV, ECHO_ENV, OpenEnvRLSettings, run_openenv_rl


@pytest.mark.docker
@pytest.mark.slow  # ~12 min on 2 cores: `make test-all` runs it
@pytest.mark.timeout(2400)
def test_a_run_over_two_openenv_environments_trains_on_both(tmp_path: Path, db_session: Session) -> None:
    settings = OpenEnvRLSettings(rl_minutes=25, rl_steps=3, workdir=tmp_path, vllm_startup_s=900)
    out = io.StringIO()
    result = run_openenv_rl(settings, console=Console(file=out, width=200))
    log = out.getvalue()[-3000:]

    assert json.loads((tmp_path / "result.json").read_text()) == result
    run = db_session.get(Run, result["run_id"])
    assert run is not None and run.purpose == "train"
    assert db_session.scalar(select(func.count()).where(TrainingStep.run_id == run.id)) >= 3, log
    consumed = dict(db_session.execute(
        select(Environment.name, func.count()).join(EpisodeGroup, EpisodeGroup.environment_id == Environment.id)
        .where(EpisodeGroup.run_id == run.id, EpisodeGroup.consumed_step.is_not(None))
        .group_by(Environment.name)).all())
    assert set(consumed) == {ECHO_ENV, DIPG_ENV}, (consumed, log)
    for name, figures in result["environments"].items():
        assert figures["episodes"] > 0, (name, figures)
        # Every episode stored token for token as sampled, with the environment's reward as its layer.
        assert figures["token_exact"] == figures["episodes"] == figures["openenv_layer"], (name, figures)
    # Reset isolation: the echo server's own step count, read after each episode, is that episode's alone.
    echo = result["environments"][ECHO_ENV]
    assert echo["state_counts_own_steps"] == echo["episodes"], echo
    # The echo reward is the environment's own: 0.1 × the length (no cap), so non-negative multiples of 0.1.
    assert all(r >= 0 and abs(r * 10 - round(r * 10)) < 1e-6 for r in echo["distinct_rewards"]), echo
    components = db_session.execute(select(Episode.reward_components).where(
        Episode.run_id == run.id, Episode.status == "completed")).scalars().all()
    assert components and all(set(c) == {"openenv"} for c in components)
