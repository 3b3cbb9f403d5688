"""Run service: creation pins environment versions and stores the resolved config; stop and resume."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.errors import InvalidRunState, NoEligibleTask
from controller.runs import create_run, finish_run, get_run, resume_run, stop_run
from core.errors import ConfigError, NotFound
from core.models import RunEnvironment
from core.schemas import RunConfig
from tests import factories as f


def _config(**values: object) -> RunConfig:
    return RunConfig.model_validate({"name": "r1", "model": "tiny", **values})


def test_create_run_pins_versions_and_stores_the_resolved_config(db_session: Session) -> None:
    alpha_v1 = f.queued_environment(db_session, name="alpha")
    alpha_v2 = f.queued_environment(db_session, name="alpha", version=2)
    beta_v1 = f.queued_environment(db_session, name="beta")
    f.queued_environment(db_session, name="beta", version=2)
    f.tasks(db_session, alpha_v1, 2)
    f.tasks(db_session, beta_v1, 2)
    config = _config(environments=[{"name": "alpha"}, {"name": "beta", "version": 1, "weight": 3}],
                     mode="sync", max_staleness=2, batch_size=4)
    run = create_run(db_session, config=config)
    db_session.commit()
    f.queued_environment(db_session, name="alpha", version=3)  # registered after launch: the run keeps v2
    db_session.commit()

    pinned = db_session.execute(
        select(RunEnvironment.environment_id, RunEnvironment.weight).where(RunEnvironment.run_id == run.id)
    ).all()
    assert sorted(pinned) == sorted([(alpha_v2.id, 1.0), (beta_v1.id, 3.0)])
    assert run.status == "pending" and run.purpose == "train" and run.mode == "sync"
    assert run.max_staleness == 0  # sync mode: no staleness
    assert run.config["environments"] == [
        {"name": "alpha", "version": 2, "weight": 1.0}, {"name": "beta", "version": 1, "weight": 3.0}
    ]
    assert run.config["max_inflight_groups"] == 4  # (0 + 1) × batch_size
    assert run.config["max_staleness"] == 0


def test_async_default_inflight_target_is_staleness_plus_one_batches(db_session: Session) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 1)
    run = create_run(db_session, config=_config(environments=[{"name": env.name}], max_staleness=2, batch_size=3))
    assert run.config["max_inflight_groups"] == 9
    assert run.max_staleness == 2


def test_the_run_seed_seeds_the_trainer_unless_the_trainer_names_its_own(db_session: Session) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 1)
    seeded = create_run(db_session, config=_config(name="seeded", environments=[{"name": env.name}], seed=7))
    own = create_run(db_session, config=_config(name="own", environments=[{"name": env.name}], seed=7,
                                                trainer={"seed": 3}))
    assert (seeded.config["trainer"]["seed"], own.config["trainer"]["seed"]) == (7, 3)


def test_unknown_environment_or_version_is_not_found_with_a_readable_message(db_session: Session) -> None:
    env = f.queued_environment(db_session, name="alpha")
    f.tasks(db_session, env, 1)
    with pytest.raises(NotFound, match=r"no environment named 'nope'; `crucible env ls` lists"):
        create_run(db_session, config=_config(environments=[{"name": "alpha"}, {"name": "nope"}]))
    with pytest.raises(NotFound, match=r"no version 7 of environment named 'alpha'"):
        create_run(db_session, config=_config(environments=[{"name": "alpha", "version": 7}]))


def test_environment_with_no_task_in_the_split_is_refused(db_session: Session) -> None:
    env = f.queued_environment(db_session, name="alpha")
    f.tasks(db_session, env, 2, split="test")
    with pytest.raises(NoEligibleTask, match=r"environment 'alpha' has no eligible task in split 'train': the split"):
        create_run(db_session, config=_config(environments=[{"name": "alpha"}]))


def test_taken_name_and_duplicate_environments_are_config_errors(db_session: Session) -> None:
    env = f.queued_environment(db_session, name="alpha")
    f.tasks(db_session, env, 1)
    create_run(db_session, config=_config(environments=[{"name": "alpha"}]))
    with pytest.raises(ConfigError, match=r"a run named 'r1' exists"):
        create_run(db_session, config=_config(environments=[{"name": "alpha"}]))
    with pytest.raises(ConfigError, match=r"expected each environment once, got alpha twice"):
        create_run(db_session, config=_config(name="r2", environments=[{"name": "alpha"}, {"name": "alpha"}]))


def test_stop_and_resume(db_session: Session) -> None:
    env = f.queued_environment(db_session)
    f.tasks(db_session, env, 1)
    run = f.launch(db_session, env)
    assert stop_run(db_session, run_id=run.id).status == "stopped"
    assert stop_run(db_session, run_id=run.id).status == "stopped"  # idempotent
    assert resume_run(db_session, run_id=run.id).status == "pending"  # never dispatched yet
    finish_run(db_session, run=get_run(db_session, run_id=run.id))
    with pytest.raises(InvalidRunState, match=r"run \d+ is completed; only a stopped run can be resumed"):
        resume_run(db_session, run_id=run.id)
    with pytest.raises(InvalidRunState, match=r"only a pending or running run can be stopped"):
        stop_run(db_session, run_id=run.id)
    with pytest.raises(NotFound, match=r"no run with id 999"):
        get_run(db_session, run_id=999)
