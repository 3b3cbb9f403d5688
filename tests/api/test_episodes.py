"""`/v1/episodes`: filtered summaries (never token arrays), full-text search, keyset pages, one episode."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from core.models import Episode, Run, Turn
from tests.api.trajectories import SeededRun


def _ids(client: TestClient, **params: object) -> list[int]:
    response = client.get("/v1/episodes", params={"limit": 500, **params})
    assert response.status_code == 200, response.text
    return [row["id"] for row in response.json()["data"]]


def test_summaries_carry_no_turns_or_tokens(client: TestClient, seeded: SeededRun) -> None:
    row = client.get("/v1/episodes?limit=1").json()["data"][0]
    assert not {"turns", "token_ids", "logprobs", "final_diff", "verifier_layers"} & set(row)
    assert row["environment"] in ("code-fix", "web-nav")


@pytest.mark.parametrize(("params", "expected"), [
    ({"status": "running"}, 2),
    ({"termination_reason": "submitted"}, 3),
    ({"environment": "web-nav"}, 4),
    ({"min_reward": 0.5}, 3),
    ({"min_reward": 0.1, "max_reward": 0.9}, 1),
    ({"policy_version": 1}, 4),
    ({"q": "segfault"}, 1),
    ({"q": "pytest"}, 10),
    ({"q": '"edit file"'}, 3),
    ({"q": "tests"}, 6),
    ({"q": "tests -error"}, 0),  # per turn: every "run tests" turn saw "error in parser"
    ({"q": "nowhere"}, 0),
    ({"termination_reason": "max_turns", "environment": "code-fix"}, 2),
])
def test_filters(client: TestClient, seeded: SeededRun, params: dict[str, object], expected: int) -> None:
    assert len(_ids(client, run_id=seeded.run_id, **params)) == expected


def test_group_filter_and_newest_first(client: TestClient, seeded: SeededRun) -> None:
    assert _ids(client, group_id=seeded.group_ids[0]) == sorted(seeded.episode_ids[0], reverse=True)


def test_keyset_pages_cover_every_episode_once(client: TestClient, seeded: SeededRun) -> None:
    seen, cursor = [], None
    while True:
        page = client.get("/v1/episodes", params={"limit": 5, **({"cursor": cursor} if cursor else {})}).json()
        seen += [row["id"] for row in page["data"]]
        if not (cursor := page["next_cursor"]):
            break
    assert seen == sorted({i for group in seeded.episode_ids for i in group}, reverse=True)


def test_show_has_turns_and_tokens_only_on_request(client: TestClient, seeded: SeededRun) -> None:
    episode_id = seeded.episode_ids[0][1]
    episode = client.get(f"/v1/episodes/{episode_id}").json()
    assert (episode["task_external_id"], episode["termination_reason"]) == ("code-fix-task", "max_turns")
    assert [layer["name"] for layer in episode["verifier_layers"]] == ["format", "hidden_tests"]
    assert episode["final_diff"].startswith("--- a/calc.py")
    turns = episode["turns"]
    assert [t["completion_text"] for t in turns] == ["run pytest", "run tests", "run tests"]
    assert turns[1]["exit_code"] == 1 and turns[1]["truncated"] and turns[1]["truncated_bytes"] == 512
    assert turns[1]["tool_call"] == {"name": "run", "arguments": {"command": "run 1"}}
    assert [t["num_tokens"] for t in turns] == [5, 3, 3] and all(t["tokens"] is None for t in turns)

    with_tokens = client.get(f"/v1/episodes/{episode_id}?tokens=true").json()["turns"][0]["tokens"]
    assert with_tokens == {"token_ids": [2, 3, 4, 5, 6], "logprobs": [0.0, 0.0, 0.0, -0.1, -0.2],
                           "loss_mask": [0, 0, 0, 1, 1], "pieces": ["fix", "the", "bug", "run", "pytest"]}
    assert client.get(f"/v1/episodes/{episode_id}/turns/0/tokens").json() == with_tokens


def test_each_turn_names_the_policy_replica_that_sampled_it(
    client: TestClient, db_session: Session, seeded: SeededRun
) -> None:
    """A pool of policy servers (task_workers/policy/pool.py) tags every turn; the API and the episode page
    show it (None with one server)."""
    episode_id = seeded.episode_ids[0][1]
    db_session.execute(update(Turn).where(Turn.episode_id == episode_id, Turn.index >= 1)
                       .values(replica="http://10.0.0.2:8000/v1"))
    db_session.commit()
    turns = client.get(f"/v1/episodes/{episode_id}").json()["turns"]
    assert [t["replica"] for t in turns] == [None, "http://10.0.0.2:8000/v1", "http://10.0.0.2:8000/v1"]
    html = client.get(f"/episodes/{episode_id}").text
    assert html.count('<span class="replica"') == 2 and "http://10.0.0.2:8000/v1" in html


def test_tokens_are_ids_only_when_the_model_has_no_tokenizer(
    client: TestClient, db_session: Session, seeded: SeededRun
) -> None:
    db_session.execute(update(Run).values(model="served-name-without-a-directory"))
    db_session.commit()
    tokens = client.get(f"/v1/episodes/{seeded.episode_ids[0][0]}/turns/0/tokens").json()
    assert tokens["pieces"] is None and tokens["token_ids"] == [2, 3, 4, 5, 6]


def test_a_running_episode_has_no_turns_yet(client: TestClient, seeded: SeededRun) -> None:
    episode = client.get(f"/v1/episodes/{seeded.episode_ids[2][3]}").json()
    assert episode["status"] == "running" and episode["turns"] == [] and episode["reward"] is None


def test_unexpected_json_shapes_do_not_crash_the_episode_views(
    client: TestClient, seeded: SeededRun, db_session: Session
) -> None:
    """Workers (and older versions of them) write these JSONB columns; a surprising shape once made
    the episode API answer 500 and its page fail to render."""
    from core.models import Episode, SandboxEvent, Turn

    episode_id = seeded.episode_ids[0][0]
    db_session.execute(update(Episode).where(Episode.id == episode_id).values(
        reward_components=[1, 2], timings="slow", failures=[3, {"reason": "sandbox_error"}],
        verifier_layers=["weird", {"score": "n/a"}, None]))
    db_session.execute(update(Turn).where(Turn.episode_id == episode_id, Turn.index == 0).values(tool_call=["ls"]))
    db_session.execute(update(Turn).where(Turn.episode_id == episode_id, Turn.index == 1).values(tool_call="raw"))
    db_session.execute(update(SandboxEvent).where(SandboxEvent.episode_id == episode_id).values(detail=[1, 2]))
    db_session.commit()

    shown = client.get(f"/v1/episodes/{episode_id}")
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["reward_components"] == {"raw": [1, 2]} and body["timings"] == {"raw": "slow"}
    # every field of the stored record (core.schemas.episode) present; the surprise shown as its detail
    assert body["verifier_layers"][0] == {"name": None, "score": None, "passed": None, "duration_s": None,
                                          "record": None, "detail": "weird"}
    assert body["failures"][0] == {"reason": None, "at": None, "worker": None, "source": None, "attempt": None,
                                   "status": None, "incarnation": None, "message": 3}
    assert body["turns"][0]["tool_call"] == {"name": "?", "arguments": ["ls"]}
    assert client.get(f"/v1/episodes?run_id={seeded.run_id}").status_code == 200
    events = client.get(f"/v1/episodes/{episode_id}/sandbox-events")
    assert events.status_code == 200 and [1, 2] in [event["detail"] for event in events.json()["data"]]
    page = client.get(f"/episodes/{episode_id}")
    assert page.status_code == 200 and "weird" in page.text
    assert client.get(f"/runs/{seeded.run_id}").status_code == 200
    group = client.get(f"/groups/{seeded.group_ids[0]}")
    assert group.status_code == 200 and "[1, 2]" in group.text  # the group page shows components as stored


def test_an_episodes_turn_frame_counts_are_shown(client: TestClient, db_session: Session, seeded: SeededRun) -> None:
    """Prefix breaks, unparsed tool calls and turns without one (task_workers/episode/loop.py) are stored per
    episode and shown in its summary and on its page."""
    episode_id = seeded.episode_ids[0][1]
    db_session.execute(update(Episode).where(Episode.id == episode_id)
                       .values(prefix_breaks=1, unparsed_tool_calls=2, turns_without_tool_call=3))
    db_session.commit()
    body = client.get(f"/v1/episodes/{episode_id}").json()
    assert (body["prefix_breaks"], body["unparsed_tool_calls"], body["turns_without_tool_call"]) == (1, 2, 3)
    html = client.get(f"/episodes/{episode_id}").text
    assert "2 unparsed" in html and "3 without a call" in html and "1 prefix breaks" in html
