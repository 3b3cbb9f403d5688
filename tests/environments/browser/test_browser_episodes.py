"""Browser episodes through the real worker: a real browser sandbox (Chromium in Docker, network none),
the real episode runner and store, and a scripted policy that reads the page from its prompt.

The page's own reward decides: a solving sequence earns 1 on every MiniWoB++ task below, a wrong
click earns what the page says (-1), a click on a bid that does not exist is a tool error the agent
sees and the episode goes on. The agent's ways around the page (reloading for an easier problem,
leaving the page, reading files, typing JavaScript) are refused as tool errors.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Turn
from core.models.artifact import EpisodeArtifact
from core.models.episode import Episode
from core.termination import TerminationReason
from environments.browser.solver import DRAG_SOLVERS, SOLVERS, solver, wrong_click
from environments.parsing import hermes_call
from environments.service import register_environment
from environments.spec import parse_spec
from task_workers.episode.runner import run_episode
from tests import factories
from tests.support.rewards import assert_reward_derived

pytestmark = [pytest.mark.docker, pytest.mark.browser]

SOLVED = sorted(SOLVERS)  # 14 MiniWoB++ tasks: the README names them


@pytest.fixture(scope="module")
def browser_image(sandbox_images: dict[str, str]) -> str:
    return sandbox_images["browser"]


def browser_spec(image: str, script: str, **extra: object) -> dict:
    return {
        "name": f"mw-{script}", "kind": "browser", "image": image,
        "sandbox": {"memory": "2g", "pids": 1024, "max_lifetime_s": 900},
        "limits": {"max_turns": 6, "episode_timeout_s": 120, "max_tool_errors": 3},
        "system_prompt": f"Operate the browser. [script:{script}]",
        **extra,
    }


def make_browser_episode(session: Session, *, image: str, script: str, payload: dict, **extra: object) -> int:
    env, _ = register_environment(session, spec=parse_spec(browser_spec(image, script, **extra)))
    the_task = factories.task(session, env, external_id=f"{payload.get('name', 'site')}-{payload.get('seed', 0)}",
                              instruction="(the page states the goal)", payload=payload)
    return factories.pending_episode(session, env=env, the_task=the_task, run_name=f"run-{script}")


def play(db_session, scripted, policy_client, sandboxes, image, *, script, steps, payload, **extra) -> Episode:
    scripted[0].scripts[script] = steps
    episode_id = make_browser_episode(db_session, image=image, script=script, payload=payload, **extra)
    run_episode(episode_id, policy=policy_client, sandboxes=sandboxes, worker="test")
    db_session.expire_all()
    episode = db_session.get(Episode, episode_id)
    assert episode is not None
    if episode.status == "completed":
        assert_reward_derived(db_session, [episode_id])
    return episode


def turns_of(db_session, episode: Episode) -> list[Turn]:
    return list(db_session.execute(select(Turn).where(Turn.episode_id == episode.id).order_by(Turn.index)).scalars())


def test_solving_actions_earn_the_pages_reward_on_every_task(db_session, scripted, policy_client, sandboxes,
                                                               browser_image):
    results = {}
    for number, name in enumerate(SOLVED):
        episode = play(db_session, scripted, policy_client, sandboxes, browser_image, script=name,
                       steps=[solver(name)] * 6, payload={"family": "miniwob", "name": name, "seed": 100 + number})
        results[name] = (episode.reward, episode.termination_reason, episode.verifier_layers[0]["detail"])
    failed = {name: result for name, result in results.items() if result[0] != 1.0}
    assert not failed, failed
    assert all(reason == TerminationReason.SUBMITTED for _, reason, _ in results.values())


def test_browsergym_text_actions_solve_the_pages_that_need_a_drag(db_session, scripted, policy_client, sandboxes,
                                                                  browser_image):
    """BrowserGym's conventions (`tool_parser: browsergym`, `browser: {tree: browsergym, reward: success}`):
    the policy reads BrowserGym's tree and writes its text actions (`drag_and_drop("17", "18")`,
    `click("19")`), the driver drags in the real Chromium (jQuery UI draggables and sortable lists), and
    the page's own reward says solved."""
    from environments.browser.actions import browsergym_text
    from environments.parsing import parse_hermes
    from task_workers.policy.scripted import detokenize

    def as_text(step):  # the scripted solver's Hermes call, written as a BrowserGym agent writes it
        return lambda prompt: "I act now.\n" + browsergym_text(parse_hermes(step(prompt)))

    results = {}
    for name in sorted(DRAG_SOLVERS):
        for seed in (200, 201):
            episode = play(db_session, scripted, policy_client, sandboxes, browser_image, script=f"{name}-{seed}",
                           steps=[as_text(solver(name))] * 6, payload={"family": "miniwob", "name": name, "seed": seed},
                           tool_parser="browsergym", tools=["click", "drag_and_drop", "noop"],
                           browser={"tree": "browsergym", "reward": "success"})
            turns = turns_of(db_session, episode)
            opening = detokenize(turns[0].token_ids[:turns[0].prompt_length])  # the scripted policy's tokenizer
            assert "\n\t[" in opening and "\n  [" not in opening  # BrowserGym's tree: a tab a level
            assert turns[0].completion_text.startswith("I act now.\ndrag_and_drop("), turns[0].completion_text
            assert turns[0].tool_call["name"] == "drag_and_drop"
            results[(name, seed)] = (episode.reward, episode.termination_reason, len(turns))
    assert all(reward == 1.0 and reason == TerminationReason.SUBMITTED for reward, reason, _ in results.values()), results


def test_a_wrong_click_earns_what_the_page_says(db_session, scripted, policy_client, sandboxes, browser_image):
    episode = play(db_session, scripted, policy_client, sandboxes, browser_image, script="wrong",
                   steps=[wrong_click] * 6, payload={"family": "miniwob", "name": "click-button", "seed": 6})
    assert episode.reward == -1.0
    assert episode.termination_reason == TerminationReason.SUBMITTED  # the page ended the task
    assert episode.num_turns == 1
    assert episode.verifier_layers[0]["name"] == "page" and not episode.verifier_layers[0]["passed"]


def test_the_success_reward_mode_scores_one_for_a_solve_and_zero_for_a_wrong_try(
        db_session, scripted, policy_client, sandboxes, browser_image):
    """`browser: {reward: success}`: BrowserGym's success (raw > 0), so a wrong try (raw −1) scores as
    giving up does, 0; the page's raw reward stays in the layer's detail."""
    wrong = play(db_session, scripted, policy_client, sandboxes, browser_image, script="wrong-success",
                 steps=[wrong_click] * 6, payload={"family": "miniwob", "name": "click-button", "seed": 6},
                 browser={"reward": "success"})
    assert wrong.reward == 0.0 and not wrong.verifier_layers[0]["passed"]
    assert "raw reward -1" in wrong.verifier_layers[0]["detail"]
    solved = play(db_session, scripted, policy_client, sandboxes, browser_image, script="solve-success",
                  steps=[solver("click-button")] * 6, payload={"family": "miniwob", "name": "click-button", "seed": 7},
                  browser={"reward": "success"})
    assert solved.reward == 1.0 and solved.verifier_layers[0]["passed"]


def test_a_missing_bid_is_a_tool_error_the_agent_sees(db_session, scripted, policy_client, sandboxes, browser_image):
    solve = solver("click-button")
    steps = [hermes_call("click", bid="99999"), hermes_call("click", bid='1"]'), lambda prompt: solve(prompt)]
    episode = play(db_session, scripted, policy_client, sandboxes, browser_image, script="missing",
                   steps=steps + [solve] * 3, payload={"family": "miniwob", "name": "click-button", "seed": 8})
    turns = turns_of(db_session, episode)
    assert turns[0].tool_status == "error" and "no element with bid '99999'" in (turns[0].observation or "")
    assert turns[1].tool_status == "error" and "expected an element id" in (turns[1].observation or "")
    assert "[" in (turns[0].observation or "") and "button" in (turns[0].observation or "")  # the page is still shown
    assert episode.reward == 1.0 and episode.num_turns == 3


def test_ways_around_the_page_are_refused(db_session, scripted, policy_client, sandboxes, browser_image):
    """A reload would draw a new (easier) problem, another page or a file would leave the task, a
    javascript: URL or typed script would run code: all are tool errors, and the page's reward stands."""
    attempts = [
        hermes_call("goto", url="/miniwob/click-button.html"),
        hermes_call("goto", url="file:///etc/passwd"),
        hermes_call("goto", url="javascript:WOB_RAW_REWARD_GLOBAL=1;WOB_DONE_GLOBAL=true"),
        hermes_call("go_back"),
        hermes_call("press", bid="13", key="F5"),
        hermes_call("press", bid="13", key="Control+F5+x"),
        hermes_call("fill", bid="13", text="x" * 20_000),
        hermes_call("scroll", dx=1e12, dy=0),
        hermes_call("select_option", bid="13", option=["a", "b"]),
        hermes_call("not_a_tool"),
    ]
    episode = play(db_session, scripted, policy_client, sandboxes, browser_image, script="around",
                   steps=attempts, payload={"family": "miniwob", "name": "click-button", "seed": 9},
                   limits={"max_turns": len(attempts), "episode_timeout_s": 120, "max_tool_errors": 100})
    turns = turns_of(db_session, episode)
    assert [turn.tool_status for turn in turns] == ["error"] * len(attempts), [t.observation[:120] for t in turns]
    assert episode.reward == 0.0  # the page never ended its task: no reward, and none faked
    assert episode.termination_reason == TerminationReason.MAX_TURNS


def test_each_turn_stores_its_screenshot_and_the_opening_its_page(db_session, scripted, policy_client, sandboxes,
                                                                   browser_image):
    episode = play(db_session, scripted, policy_client, sandboxes, browser_image, script="shots",
                   steps=[solver("enter-text")] * 4, payload={"family": "miniwob", "name": "enter-text", "seed": 3})
    rows = db_session.execute(select(EpisodeArtifact.turn_index, EpisodeArtifact.name, EpisodeArtifact.media_type,
                                     EpisodeArtifact.data).where(EpisodeArtifact.episode_id == episode.id)
                              .order_by(EpisodeArtifact.id)).all()
    kinds = [(row.turn_index, row.name) for row in rows]
    assert kinds == [(None, "observation"), (None, "screenshot"), (0, "screenshot"), (1, "screenshot")], kinds
    assert all(row.data.startswith(b"\x89PNG") for row in rows if row.name == "screenshot")
    assert b"# Goal" in rows[0].data and b"textbox" in rows[0].data


def shop_payload(index: int) -> dict:
    from environments.browser.sandbox.sites import shop

    return {"family": "site", "navigation": True, **shop.generate_task(index)}


def test_a_shop_order_placed_through_the_pages_is_verified_from_the_shops_state(
        db_session, scripted, policy_client, sandboxes, browser_image):
    from tests.support.shop_solver import customer, turns_needed

    payload = shop_payload(3)  # two named items with options, a full shipping address
    turns = turns_needed(payload["check"])
    scripted[0].max_model_len = 1 << 20  # the scripted tokenizer is one token per byte: whole pages add up
    episode = play(db_session, scripted, policy_client, sandboxes, browser_image, script="shop",
                   steps=[customer(payload["check"])] * turns + [hermes_call("submit", answer="done")],
                   payload=payload,
                   limits={"max_turns": turns + 1, "max_context_tokens": 200_000, "episode_timeout_s": 300,
                           "max_tool_errors": 2})
    statuses = [turn.tool_status for turn in turns_of(db_session, episode)]
    assert episode.termination_reason == TerminationReason.SUBMITTED, (episode.termination_reason, episode.failures)
    assert statuses == ["ok"] * (turns + 1), [t.observation[:200] for t in turns_of(db_session, episode) if t.tool_status != "ok"]
    assert episode.reward == 1.0, episode.verifier_layers
    assert episode.verifier_layers[0]["name"] == "site_state"


def test_claiming_an_order_without_placing_it_earns_nothing(db_session, scripted, policy_client, sandboxes,
                                                             browser_image):
    payload = shop_payload(3)
    episode = play(db_session, scripted, policy_client, sandboxes, browser_image, script="claim",
                   steps=[hermes_call("submit", answer="I placed the order: 2x Falcon T-shirt, order #1")],
                   payload=payload)
    assert episode.termination_reason == TerminationReason.SUBMITTED
    assert episode.reward == 0.0 and "no order" in episode.verifier_layers[0]["detail"].lower()
