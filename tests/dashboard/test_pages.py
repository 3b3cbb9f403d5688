"""Dashboard pages rendered by the server (no browser): headers, deep links, errors, no outside assets."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

import api.dashboard
from core.models import Episode
from tests.api.trajectories import SeededRun

DASHBOARD = Path(api.dashboard.__file__).parent


def test_pages_forbid_anything_not_served_here(client: TestClient, seeded: SeededRun) -> None:
    for path in ("/", f"/runs/{seeded.run_id}", f"/groups/{seeded.group_ids[0]}", f"/episodes/{seeded.episode_ids[0][0]}",
                 "/episodes"):
        response = client.get(path)
        assert response.status_code == 200, path
        csp = response.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", response.text), path


def test_no_template_or_script_references_the_internet() -> None:
    for file in [*DASHBOARD.glob("templates/*.html"), *DASHBOARD.glob("static/*")]:
        text = file.read_text()
        urls = set(re.findall(r"https?://[^\s\"'`)]+", text)) - {"http://www.w3.org/2000/svg"}
        assert urls == set(), f"{file.name} refers to {urls}"


def test_the_run_page_embeds_the_run_and_fetches_its_chart_data(client: TestClient, seeded: SeededRun) -> None:
    """The run is embedded; the charts' data is not (run.js fetches /metrics and /stats on load, which
    test_browser draws), so the page stays small however many steps the run has."""
    html = client.get(f"/runs/{seeded.run_id}").text
    island = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', html, re.S)
    assert island is not None
    data = json.loads(island.group(1))
    assert set(data) == {"run", "names"} and data["run"]["id"] == seeded.run_id  # names: /v1/metric-names
    assert data["run"]["summary"]["episodes"] == {"completed": 10, "running": 2}
    assert 'href="/groups/' in html and "degenerate" in html
    script = (DASHBOARD / "static" / "run.js").read_text()
    assert "/v1/runs/${runId}/metrics" in script and "/v1/runs/${runId}/stats" in script


def test_episode_page_has_turns_tools_verifier_diff_and_sandbox(client: TestClient, seeded: SeededRun) -> None:
    html = client.get(f"/episodes/{seeded.episode_ids[0][1]}").text
    assert 'id="turn-0"' in html and 'id="turn-2"' in html
    assert "exit 1" in html and "truncated (512 bytes cut)" in html
    assert "hidden_tests" in html and "+return a + b" in html
    assert "crucible sandbox shell sb-00011" in html


def test_episode_page_shows_the_judges_prompt_output_and_score_escaped(client: TestClient, seeded: SeededRun,
                                                                       db_session: Session) -> None:
    """The judge layer's record (environments/judge.py): the judge, its score and latency, its whole output
    and the prompt it read, which holds the agent's text, so it is escaped like every stored output."""
    episode = db_session.get(Episode, seeded.episode_ids[0][1])
    record = {"judge": "http://127.0.0.1:8001/v1", "model": "tiny-judge", "mode": "pointwise",
              "prompt": "Rubric: be brief\n<script>alert(1)</script> Score: 10", "output": "Reason: short.\nScore: 7",
              "score": 0.7, "scale": 10, "seconds": 0.42, "error": None}
    episode.verifier_layers = [*episode.verifier_layers, {"name": "judge", "score": 0.7, "passed": True,
                                                          "detail": "score 7/10", "duration_s": 0.42, "record": record}]
    db_session.commit()
    html = client.get(f"/episodes/{episode.id}").text
    judge = html[html.index('class="judge-record"'):]
    assert "tiny-judge" in judge and "http://127.0.0.1:8001/v1" in judge and "score 7.0/10" in judge
    assert "Reason: short.\nScore: 7" in judge and "&lt;script&gt;alert(1)&lt;/script&gt; Score: 10" in judge
    assert "<script>alert(1)" not in html


def test_unknown_ids_render_an_html_404(client: TestClient, seeded: SeededRun) -> None:
    response = client.get("/runs/999")
    assert response.status_code == 404 and response.headers["content-type"].startswith("text/html")
    assert "no run with id 999" in response.text


def test_empty_filter_fields_redirect_to_a_clean_url(client: TestClient, seeded: SeededRun) -> None:
    response = client.get("/episodes?run_id=&status=&q=pytest", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/episodes?q=pytest"
    page = client.get("/episodes?q=pytest&termination_reason=submitted").text
    assert page.count('class="episode-link"') == 3


def test_pages_are_keyset_paged(client: TestClient, seeded: SeededRun) -> None:
    html = client.get(f"/episodes?run_id={seeded.run_id}").text
    assert html.count('class="episode-link"') == 12 and 'id="next-page"' not in html
