"""`GET /v1/runs/{id}/metrics` over stored step points: a step the trainer stored a point for is read
from its training_steps row (its episodes are not read), older steps are computed from the episodes,
and a long run is charted at an evenly strided subset of its steps (`max_points`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, insert, select, update
from sqlalchemy.orm import Session

from core.models import Episode, EpisodeGroup, TrainingStep
from core.step_points import episode_points, step_point
from tests import factories
from tests.api.trajectories import SeededRun


@contextmanager
def statements() -> Iterator[list[str]]:
    """Every SQL statement any engine of this process sends while the block runs."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def _store_points(db_session: Session, run_id: int, *, steps: list[int]) -> None:
    """What the trainer does at commit, for steps recorded before it kept points."""
    for step in steps:
        db_session.execute(update(TrainingStep).where(TrainingStep.run_id == run_id, TrainingStep.step == step)
                           .values(points=step_point(db_session, run_id=run_id, step=step)))
    db_session.commit()


def _trained_step(db_session: Session, seeded: SeededRun, *, step: int, rewards: list[float], store: bool) -> int:
    """A group consumed at `step` with ended episodes of `rewards`, and the step's row (its point stored
    as the trainer stores it, or NULL as before the trainer kept points). Returns the group id."""
    group = EpisodeGroup(run_id=seeded.run_id, group_index=10 + step, task_id=1,
                         environment_id=seeded.environment_ids[1], size=len(rewards), policy_version=step,
                         status="consumed", consumed_step=step)
    db_session.add(group)
    db_session.flush()
    db_session.add_all(Episode(run_id=seeded.run_id, group_id=group.id, sample_index=i, task_id=1,
                               environment_id=seeded.environment_ids[1], status="completed",
                               termination_reason="submitted" if reward else "max_turns", reward=reward,
                               reward_components={"format": 1.0, "hidden_tests": reward}, policy_version=step)
                       for i, reward in enumerate(rewards))
    db_session.flush()
    points = step_point(db_session, run_id=seeded.run_id, step=step) if store else None
    db_session.add(TrainingStep(run_id=seeded.run_id, step=step, policy_version=step, metrics={"loss/policy": 0.1},
                                points=points))
    db_session.commit()
    return group.id


def _metrics(client: TestClient, run_id: int, **params: Any) -> dict[str, Any]:
    response = client.get(f"/v1/runs/{run_id}/metrics", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_stored_points_are_served_without_reading_episodes(
    client: TestClient, db_session: Session, seeded: SeededRun
) -> None:
    computed = _metrics(client, seeded.run_id)["points"]  # step 1 (points NULL): from its episodes
    _store_points(db_session, seeded.run_id, steps=[1, 2])
    stored = db_session.execute(select(TrainingStep.step, TrainingStep.points)
                                .where(TrainingStep.run_id == seeded.run_id).order_by(TrainingStep.step)).all()
    assert [step for step, _ in stored] == [1, 2] and stored[1][1]["episodes"] == 0  # step 2 trained on nothing
    # the episodes change after the point was stored: a page that recomputed would show the new rewards
    db_session.execute(update(Episode).where(Episode.run_id == seeded.run_id).values(reward=-5.0))
    db_session.commit()
    with statements() as sent:
        served = _metrics(client, seeded.run_id)["points"]
    assert served == computed and served[0]["reward_mean"] == 0.375
    assert sent and not [s for s in sent if re.search(r"\bepisodes\b", s)], "the episodes table was read"


def test_old_steps_are_computed_and_merged_with_stored_ones(
    client: TestClient, db_session: Session, seeded: SeededRun
) -> None:
    # step 1: points NULL (seeded, computed); step 2: no groups; step 3: stored; step 4: NULL; step 5: stored
    stored_group = _trained_step(db_session, seeded, step=3, rewards=[1.0, 0.0], store=True)
    _trained_step(db_session, seeded, step=4, rewards=[1.0, 1.0, 0.0, 0.0], store=False)
    _trained_step(db_session, seeded, step=5, rewards=[0.5], store=True)
    db_session.execute(update(Episode).where(Episode.group_id == stored_group).values(reward=9.0))  # never read
    db_session.commit()
    with statements() as sent:
        metrics = _metrics(client, seeded.run_id)
    assert [s["step"] for s in metrics["steps"]] == [1, 2, 3, 4, 5]
    by_x = {p["x"]: p for p in metrics["points"]}
    assert sorted(by_x) == [1, 3, 4, 5]
    assert [by_x[x]["reward_mean"] for x in (1, 3, 4, 5)] == [0.375, 0.5, 0.5, 0.5]
    assert by_x[1]["by_environment"] == {"code-fix": 0.375} and by_x[3]["by_environment"] == {"web-nav": 0.5}
    assert by_x[4]["termination"] == {"submitted": 2, "max_turns": 2}
    assert by_x[4]["components"] == {"format": 1.0, "hidden_tests": 0.5}
    assert by_x[3] == {**by_x[3], "episodes": 2, "reward_min": 0.0, "reward_max": 1.0}
    # the pass over the episodes covers the NULL steps only
    aggregates = [s for s in sent if "GROUPING SETS" in s]
    assert len(aggregates) == 1
    recomputed = episode_points(db_session, run_id=seeded.run_id, axis="step")
    assert recomputed[3]["reward_mean"] == 9.0  # what a recomputation would have served


def long_run(db_session: Session, *, first: int, count: int) -> int:
    """A run with `count` training steps from `first` on, each with a stored point (reward mean = step),
    written as rows directly; one consumed group makes the run's axis `step`."""
    run = factories.run(db_session, status="running", policy_version=first + count - 1)
    factories.group(db_session, run=run, status="consumed", consumed_step=first)
    point = {"episodes": 2, "reward_std": 0.0, "reward_min": 0.0, "reward_max": 1.0, "by_environment": {},
             "components": {}, "termination": {"submitted": 2}}
    db_session.execute(insert(TrainingStep), [
        {"run_id": run.id, "step": step, "policy_version": step, "metrics": {"loss/policy": step / 10},
         "points": {**point, "x": step, "reward_mean": float(step)}}
        for step in range(first, first + count)])
    db_session.commit()
    return run.id


def test_a_long_run_is_charted_at_strided_steps_with_the_first_and_the_latest(
    client: TestClient, db_session: Session
) -> None:
    run_id = long_run(db_session, first=101, count=3000)  # steps 101 … 3100
    metrics = _metrics(client, run_id)  # max_points defaults to 1000
    steps = [s["step"] for s in metrics["steps"]]
    assert (metrics["stride"], metrics["total_steps"]) == (4, 3000)  # ceil(2999 / 999)
    assert len(steps) <= 1000 and steps[0] == 101 and steps[-1] == 3100
    assert steps[:-1] == list(range(101, 3100, 4))
    assert [p["x"] for p in metrics["points"]] == steps
    assert all(p["reward_mean"] == p["x"] for p in metrics["points"])  # each step's own point, not a neighbour's

    ten = _metrics(client, run_id, max_points=10)
    assert [s["step"] for s in ten["steps"]] == [*range(101, 3100, 334), 3100] and len(ten["steps"]) == 10
    assert ten["stride"] == 334 and [p["x"] for p in ten["points"]] == [s["step"] for s in ten["steps"]]

    two = _metrics(client, run_id, max_points=2)
    assert [s["step"] for s in two["steps"]] == [101, 3100] and two["stride"] == 2999

    everything = _metrics(client, run_id, max_points=10_000)
    assert (everything["stride"], len(everything["steps"]), len(everything["points"])) == (1, 3000, 3000)


@pytest.mark.parametrize("steps_count", [999, 1000, 1001, 1998, 2000, 2001])
def test_the_stride_never_charts_more_than_max_points(
    client: TestClient, db_session: Session, steps_count: int
) -> None:
    run_id = long_run(db_session, first=1, count=steps_count)
    metrics = _metrics(client, run_id)
    steps = [s["step"] for s in metrics["steps"]]
    assert len(steps) <= 1000 and steps[0] == 1 and steps[-1] == steps_count
    assert len(steps) == steps_count or metrics["stride"] > 1


@pytest.mark.parametrize("bad", ["0", "-1", "1", str(10**9), "10001", "abc", "1.5", ""])
def test_a_bad_max_points_is_a_422_that_names_it(client: TestClient, seeded: SeededRun, bad: str) -> None:
    response = client.get(f"/v1/runs/{seeded.run_id}/metrics", params={"max_points": bad})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error" and error["message"].startswith("query.max_points: ")


def test_the_dashboard_run_page_stays_small_and_its_charts_fetch_the_strided_metrics(
    client: TestClient, db_session: Session
) -> None:
    """The page embeds the run, not its 2,500 steps: run.js fetches the strided metrics on load
    (test_strided_run_browser draws them)."""
    run_id = long_run(db_session, first=1, count=2500)
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and 'id="training-stride"' in page.text
    assert '"total_steps"' not in page.text and len(page.content) < 64 * 1024
    metrics = client.get(f"/v1/runs/{run_id}/metrics").json()
    assert metrics["stride"] == 3 and metrics["total_steps"] == 2500
