"""An eval run's page in a real headless Chromium shows `crucible eval`'s report: pass@1 and pass@k with
their 95 % intervals, overall, per environment and per bucket, as GET /v1/runs/{id}/eval has them; a train
run's page has no such section, but charts the evaluations of its checkpoints: pass@1 against step, each
point with its interval, as GET /v1/runs/{id}/checkpoint-evals has them."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.models import PolicyVersion
from core.schemas.run import CheckpointRef
from core.versions import CHECKPOINT_TAG_BASE
from tests import factories
from tests.dashboard.conftest import screenshot, sign_in
from tests.support.eval_runs import seed_eval_run

pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")


def _percent(rate: dict | None) -> str:
    return "–" if rate is None else f"{100 * rate['value']:.1f}% [{100 * rate['low']:.1f}, {100 * rate['high']:.1f}]"


def test_an_eval_runs_page_shows_its_report(  # type: ignore[no-untyped-def]
    page, token: str, client: TestClient, db_session: Session,
) -> None:
    run = seed_eval_run(db_session, name="eval-page", outcomes=[[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, "failed"]],
                        difficulty=["easy", None, "hard", "easy"])
    report = client.get(f"/v1/runs/{run.id}/eval").json()
    sign_in(page, token)
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#eval-table tbody tr")
    rows = {line.get_attribute("data-row"): [cell.inner_text() for cell in line.locator("td").all()]
            for line in page.locator("#eval-table tbody tr").all()}
    cells = {"all": report["overall"], "environment eval-page": report["by_environment"]["eval-page"],
             **{f"bucket {name}": cell for name, cell in report["by_bucket"].items()}}
    assert list(rows) == list(cells)
    for label, cell in cells.items():
        assert rows[label] == [label, str(cell["tasks"]), str(cell["episodes"]), str(cell["solved"]),
                               str(cell["excluded"]), _percent(cell["pass_at_1"]), _percent(cell["pass_at_k"])]
    assert rows["all"][4] == "1"  # the sandbox fault, excluded
    assert "pass@2 [95 %]" in page.locator("#eval-table thead").inner_text()
    assert f"crucible eval show {run.id}" in page.locator("#evaluation").inner_text()
    screenshot(page, "eval-run-report")


def test_a_train_runs_page_has_no_evaluation(page, token: str, seeded) -> None:  # type: ignore[no-untyped-def]
    sign_in(page, token)
    page.goto(f"/runs/{seeded.run_id}")
    page.wait_for_selector("#summary")
    assert page.locator("#evaluation").count() == 0
    assert "No checkpoint evaluated yet" in page.locator("#checkpoint-evals").inner_text()


def test_a_train_runs_page_charts_its_checkpoints_by_step(  # type: ignore[no-untyped-def]
    page, token: str, client: TestClient, db_session: Session,
) -> None:
    train = factories.run(db_session, purpose="train", status="completed")
    for step in (5, 15):
        db_session.add(PolicyVersion(run_id=train.id, version=step, training_step=step, checkpoint_path=f"/c/{step}"))
    evals = {step: seed_eval_run(db_session, name=f"ckpt-page-{step}", outcomes=outcomes,
                                 checkpoint=CheckpointRef(run_id=train.id, step=step, version=step, tag=CHECKPOINT_TAG_BASE + step))
             for step, outcomes in ((15, [[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]), (5, [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]))}
    expected = client.get(f"/v1/runs/{train.id}/checkpoint-evals").json()["evals"]
    sign_in(page, token)
    page.goto(f"/runs/{train.id}")
    page.wait_for_selector("#checkpoint-table tbody tr")
    rows = [[cell.inner_text() for cell in line.locator("td").all()] for line in page.locator("#checkpoint-table tbody tr").all()]
    assert [(row[0], row[2], row[9]) for row in rows] == [
        (str(point["step"]), f"#{point['report']['run_id']}", _percent(point["report"]["overall"]["pass_at_1"]))
        for point in expected]
    assert [row[0] for row in rows] == ["5", "15"]
    points = page.locator("#checkpoint-chart circle.point").all()
    assert [(p.get_attribute("data-step"), float(p.get_attribute("data-value") or "nan")) for p in points] == \
        [(str(point["step"]), point["report"]["overall"]["pass_at_1"]["value"]) for point in expected]
    assert page.locator("#checkpoint-chart line.interval").count() == 2
    low, high = (float(page.locator("#checkpoint-chart line.interval").first.get_attribute(end) or "nan")
                 for end in ("y1", "y2"))
    assert low > high  # the interval spans a height (SVG's y grows downwards: the low end is lower)
    screenshot(page, "train-run-checkpoints")
    page.goto(f"/runs/{evals[5].id}")
    page.wait_for_selector("#eval-checkpoint")
    assert f"Checkpoint of run #{train.id} at step 5" in page.locator("#eval-checkpoint").inner_text()
