"""(issue 51) The agent program's gateway against the scripted policy server: every call a turn holding exactly
what was served, stitched into token streams (a call that extends the last continues it; one that rewrites
its context starts a new segment with its whole prompt), the run's sampling whatever the program asks, the
call budget, and every malformed request refused without sampling."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from core.schemas.run import Sampling
from core.termination import TerminationReason
from environments.spec import Limits
from task_workers.episode.gateway import Gateway
from task_workers.episode.loop import LoopContext
from task_workers.policy.client import PolicyClient
from task_workers.policy.scripted import IM_END, ScriptedPolicy, serve, tokenize

SCRIPT = [f"step {k}: ```bash\necho {k}\n```" for k in range(6)]


@pytest.fixture
def served() -> Iterator[tuple[ScriptedPolicy, PolicyClient]]:
    policy = ScriptedPolicy({"g": SCRIPT})
    with serve(policy) as url:
        client = PolicyClient(base_url=url, retries=1, backoff_s=0.05)
        yield policy, client
        client.close()


def _gateway(client: PolicyClient, *, max_calls: int = 10, **limits: object) -> Gateway:
    ctx = LoopContext(kind=None, task=None, sandbox=None, policy=client,  # type: ignore[arg-type]
                      limits=Limits(**limits), sampling=Sampling())  # type: ignore[arg-type]
    return Gateway(ctx, max_calls=max_calls, action_regex=r"```bash\n(.*?)\n```")


def _call(gateway: Gateway, messages: list[dict], **extra: object) -> tuple[int, dict]:
    status, body = gateway.handle("POST", "/v1/chat/completions", json.dumps({"messages": messages, **extra}))
    return status, json.loads(body)


def _streams(gateway: Gateway) -> dict[int, list[int]]:
    streams: dict[int, list[int]] = {}
    for turn in gateway.trajectory.turns:
        streams.setdefault(turn.segment, []).extend(turn.token_ids)
    return streams


def test_a_program_that_extends_its_context_makes_one_stream_of_exactly_the_served_tokens(served) -> None:
    policy, client = served
    gateway = _gateway(client)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it [script:g]"}]
    for _ in range(3):
        status, reply = _call(gateway, messages, temperature=2.0, n=4, logprobs=True, model="gpt-9")
        assert status == 200
        content = reply["choices"][0]["message"]["content"]
        assert not content.endswith("<|im_end|>")  # the template writes the end of turn back itself
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "<returncode>0</returncode>"}]
    turns = gateway.trajectory.turns
    assert [turn.segment for turn in turns] == [0, 0, 0] and gateway.segments == 1
    # The one stream is the last prompt served, then its completion: nothing re-rendered, nothing missing.
    last_prompt, last_completion = policy.served[-1]
    assert _streams(gateway) == {0: last_prompt + last_completion}
    stream: list[int] = []
    for turn, (prompt, completion) in zip(turns, policy.served, strict=True):
        stream += turn.token_ids
        assert stream == prompt + completion  # each call's prompt as served, then what it sampled
        assert turn.token_ids[turn.prompt_length:] == completion == [*tokenize(SCRIPT[turn.index]), IM_END]
        assert turn.loss_mask == [0] * turn.prompt_length + [1] * len(completion)
        assert turn.logprobs[:turn.prompt_length] == [0.0] * turn.prompt_length
    assert gateway.trajectory.turns_without_tool_call == 0


def test_a_program_that_rewrites_its_context_starts_a_new_segment_holding_its_whole_prompt(served) -> None:
    policy, client = served
    gateway = _gateway(client)
    first = [{"role": "user", "content": "fix it [script:g]"}]
    _, reply = _call(gateway, first)
    answer = reply["choices"][0]["message"]["content"]
    # The program summarises instead of keeping the history (a context manager's rewrite).
    _, _ = _call(gateway, [{"role": "user", "content": "summary: ran echo 0 [script:g]"},
                           {"role": "assistant", "content": answer}, {"role": "user", "content": "go on"}])
    turns = gateway.trajectory.turns
    assert [turn.segment for turn in turns] == [0, 1] and gateway.segments == 2
    assert turns[1].prompt_length == len(policy.served[1][0])  # its whole prompt, none of the first stream
    assert _streams(gateway) == {0: policy.served[0][0] + policy.served[0][1],
                                 1: policy.served[1][0] + policy.served[1][1]}


def test_the_call_budget_ends_the_episode_and_a_call_past_it_samples_nothing(served) -> None:
    policy, client = served
    gateway = _gateway(client, max_calls=2)
    messages = [{"role": "user", "content": "[script:g]"}]
    assert [_call(gateway, messages)[0] for _ in range(4)] == [200, 200, 429, 429]
    assert len(policy.served) == 2 and len(gateway.trajectory.turns) == 2
    assert gateway.ended is TerminationReason.MAX_TURNS and gateway.refused == 2


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("POST", "/v1/chat/completions", "not json", 400),
    ("POST", "/v1/chat/completions", "[]", 400),
    ("POST", "/v1/chat/completions", json.dumps({"messages": []}), 400),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": 7}]}), 400),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"content": "no role"}]}), 400),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}), 400),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}), 400),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": "all"}), 400),
    ("POST", "/v1/completions", json.dumps({"prompt": "raw text"}), 404),
    ("DELETE", "/v1/chat/completions", "", 404),
    ("POST", "/../../episodes/999/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}]}), 404),
])
def test_a_malformed_request_is_refused_without_sampling(served, method: str, path: str, body: str, status: int) -> None:
    policy, client = served
    gateway = _gateway(client)
    answered, text = gateway.handle(method, path, body)
    assert answered == status and "crucible gateway" in json.loads(text)["error"]["message"]
    assert policy.served == [] and gateway.trajectory.turns == [] and gateway.refused == 1
    assert gateway.waited_s == 0.0  # a refused request's time is the program's own


def test_requests_refused_unread_spend_the_call_budget(served) -> None:
    policy, client = served
    gateway = _gateway(client, max_calls=2)
    assert [gateway.handle("POST", "/v1/chat/completions", "not json")[0] for _ in range(2)] == [400, 400]
    assert _call(gateway, [{"role": "user", "content": "[script:g]"}])[0] == 429
    assert policy.served == [] and gateway.ended is TerminationReason.MAX_TURNS


def test_the_programs_token_budget_is_capped_by_the_spec_and_the_models_list_names_one_model(served) -> None:
    policy, client = served
    gateway = _gateway(client, max_response_tokens=4)
    status, reply = _call(gateway, [{"role": "user", "content": "[script:g]"}], max_tokens=10_000)
    assert status == 200 and reply["choices"][0]["finish_reason"] == "length"
    assert len(policy.served[0][1]) == 4
    assert json.loads(gateway.handle("GET", "/v1/models", "")[1])["data"] == [{"id": "policy", "object": "model"}]
    # A reply with no action in the program's own syntax is counted as a turn without one.
    assert gateway.trajectory.turns_without_tool_call == 1
