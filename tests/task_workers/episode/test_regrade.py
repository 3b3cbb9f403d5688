"""Re-grading what was already trained on (issue 22, item 5): a run graded by a deliberately weakened
grader (a fixture: no blinding, no Python monitors) pays an oracle hack full reward; `crucible episodes
regrade` with the current grader finds that episode, stores the new verdict beside the old, and names the
training step that consumed it. Real worker, sandboxes and verifier, played as in the red team."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from typer.testing import CliRunner

from api.main import create_app
from api.services.tokens import create_token
from cli.main import app
from core.models import Episode, EpisodeGroup, EpisodeRegrade
from environments.code_repo import monitors, verifier
from environments.parsing import hermes_call
from task_workers.episode.regrade import parse_steps, regrade_run
from tests.environments.code_repo.test_red_team import RIGHT, SUBMIT, WRONG, append, play
from tests.environments.code_repo.test_red_team_blinded import FILE_ORACLE

pytestmark = pytest.mark.docker


def _weaken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grader as it was before this issue's defences, more or less: in-process verdicts, no monitors."""
    monkeypatch.setattr(verifier, "unblinded_reason", lambda task, enabled: "weakened for the test")
    monkeypatch.setattr(monitors, "inspect_python", lambda path, *, new, old: monitors.Findings())


def test_regrade_finds_the_hacked_episodes_and_names_the_steps_that_trained_on_them(
    db_session, scripted, sandboxes, policy_client, code_repo_image, calc_payload, wrong_fix_reward, monkeypatch
) -> None:
    policy, _ = scripted
    policy.scripts["rg-hack"] = [append(FILE_ORACLE), WRONG, SUBMIT]
    policy.scripts["rg-right"] = [RIGHT, SUBMIT]
    policy.scripts["rg-wrong"] = [WRONG, hermes_call("run_tests"), SUBMIT]
    with monkeypatch.context() as weakened:
        _weaken(weakened)
        played = {name: play(db_session, image=code_repo_image, payload=calc_payload, script=f"rg-{name}",
                             policy=policy, sandboxes=sandboxes, client=policy_client)
                  for name in ("hack", "right", "wrong")}
    hack, right, wrong = played["hack"], played["right"], played["wrong"]
    assert hack.reward == pytest.approx(1.0) and hack.flags == []  # the hole: paid in full, unflagged
    assert "weakened for the test" in hack.verifier_layers[-1]["detail"]
    # The trainer consumed the hack's group at step 3 and the honest one's at step 4.
    for episode, step in ((hack, 3), (right, 4)):
        db_session.execute(update(EpisodeGroup).where(EpisodeGroup.id == episode.group_id).values(consumed_step=step))
        db_session.execute(update(Episode).where(Episode.id == episode.id).values(advantage=0.5))
    db_session.commit()
    run_id = hack.run_id  # each played episode is a run of its own (tests/factories.pending_episode)
    for honest in (right, wrong):  # the honest episodes' rewards stand under the current grader
        unchanged = regrade_run(db_session, run_id=honest.run_id, sandboxes=sandboxes)
        assert len(unchanged.episodes) == 1 and unchanged.changed == [] and unchanged.steps == []
        assert unchanged.episodes[0].after == pytest.approx(honest.reward)

    report = regrade_run(db_session, run_id=run_id, sandboxes=sandboxes)
    [changed] = report.changed
    assert changed.episode_id == hack.id and changed.step == 3
    assert changed.after <= wrong_fix_reward + 1e-9 and "result_forging" in changed.flags_after
    assert report.steps == [{"step": 3, "episodes": [hack.id], "reward_change": pytest.approx(changed.after - 1.0)}]
    # Stored beside the original, never over it.
    db_session.expire_all()
    assert db_session.get(Episode, hack.id).reward == pytest.approx(1.0)
    stored = db_session.execute(select(EpisodeRegrade).where(EpisodeRegrade.episode_id == hack.id)).scalar_one()
    assert stored.previous_reward == pytest.approx(1.0) and stored.grader == report.grader

    # The same through the CLI, limited to the steps that trained.
    result = CliRunner().invoke(app, ["episodes", "regrade", "--run", str(run_id), "--steps", "3..4", "--output", "json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["regraded"] == 1 and [row["episode_id"] for row in printed["changed"]] == [hack.id]
    assert printed["steps"] == [{"step": 3, "episodes": [hack.id], "reward_change": pytest.approx(changed.after - 1.0)}]

    # And through the API: what the regrade found, and how the run was graded (blinded or not).
    _, token = create_token(db_session, name="regrade")
    db_session.commit()
    with TestClient(create_app(), headers={"Authorization": f"Bearer {token}"}) as client:
        shown = client.get(f"/v1/runs/{run_id}/grading")
        assert shown.status_code == 200, shown.text
        grading = shown.json()
        assert client.get("/v1/runs/999999999/grading").status_code == 404
        page = client.get(f"/runs/{run_id}")  # the run page says it too
        assert page.status_code == 200
        section = page.text.split('id="grading"', 1)[1].split("</section>", 1)[0]
        assert 'id="unblinded-grades">1<' in section and 'id="regraded-changed">1<' in section
        assert f'<a href="/episodes/{hack.id}">{hack.id}</a>' in section and "<td class=\"num\">3</td>" in section
    assert [row["episode_id"] for row in grading["changed"]] == [hack.id] and grading["changed"][0]["step"] == 3
    assert grading["steps"] == [{"step": 3, "episodes": [hack.id], "reward_change": pytest.approx(changed.after - 1.0)}]
    assert (grading["hidden_grades"], grading["unblinded_grades"]) == (1, 1)  # the weakened grader did not blind
    assert grading["blinded_test_share"] == 0.0


@pytest.mark.parametrize("text", ["x", "3..1", "-1..2", "a..b", "1...2", "9" * 40 + "..x"])
def test_a_bad_step_range_is_refused_in_one_line(text: str) -> None:
    result = CliRunner().invoke(app, ["episodes", "regrade", "--run", "1", "--steps", text])
    assert result.exit_code != 0 and "--steps: expected" in result.output and result.output.count("\n") <= 2


def test_step_ranges() -> None:
    assert parse_steps("3..9") == (3, 9) and parse_steps("4") == (4, 4) and parse_steps(None) is None
    assert parse_steps("..2") == (0, 2) and parse_steps("5..")[0] == 5
