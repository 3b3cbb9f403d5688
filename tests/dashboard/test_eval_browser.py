"""An eval run's page in a real headless Chromium shows `crucible eval`'s report: pass@1 and pass@k with
their 95 % intervals, overall, per environment and per bucket, as GET /v1/runs/{id}/eval has them; a train
run's page has no such section."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

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
