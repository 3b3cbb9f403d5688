"""A real vLLM (CPU) server on a fresh tiny model: token ids and logprobs, the probe, weight sync.

The session's server (tests/conftest.py: one start for every vLLM test), put back on the tiny model's
weights before each test here; tests that change the served weights also restore them before they end.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from core.versions import Label
from trainer.errors import WeightSyncError
from trainer.probe import probe, probe_token_ids, trainer_logprobs, verify_sync
from trainer.serving import VllmServer
from trainer.weight_sync import ReloadWeightSyncer, make_weight_syncer

# float32 on both sides: measured agreement ~1e-7 mean, ~1e-6 max per token.
AGREE = 1e-4
# A perturbation of std 0.02 on every weight moves probe logprobs by ~0.3 nats on average.
DISAGREE = 0.05
MIN_SPAN = 64  # tokens of each version in the mid-completion sync test
MESSAGES = [{"role": "user", "content": "Run the tests and tell me what fails."}]


def _chat(server: VllmServer) -> dict:
    """A greedy chat completion; the choice, with the prompt's token ids (top level in chat) added."""
    body = {"model": server.model_name, "messages": MESSAGES, "max_tokens": 12, "temperature": 0.0,
            "logprobs": True, "return_token_ids": True}
    response = httpx.post(f"{server.api_url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    data = response.json()
    return {**data["choices"][0], "prompt_token_ids": data["prompt_token_ids"]}


def _perturbed(model: PreTrainedModel, *, seed: int) -> PreTrainedModel:
    """A copy with every weight moved by N(0, 0.02²): what a (large) optimizer step looks like."""
    new = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    return new


def _sampled_logprobs_match(model: PreTrainedModel, choice: dict) -> float:
    """Largest |Δ| between vLLM's logprobs of the tokens it sampled and the trainer's, teacher-forced."""
    prompt, completion = choice["prompt_token_ids"], choice["token_ids"]
    served = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    recomputed = trainer_logprobs(model=model, token_ids=prompt + completion)[len(prompt) - 1:]
    return max(abs(a - b) for a, b in zip(served, recomputed, strict=True))


@pytest.fixture(autouse=True)
def _starting_weights(served_original: VllmServer) -> None:
    """The session's server is shared (tests/conftest.py): each test here starts on the tiny model's
    own weights, whatever a test before it trained and synced."""


@pytest.fixture
def syncer(vllm_server: VllmServer) -> Iterator[ReloadWeightSyncer]:
    syncer = make_weight_syncer("reload", base_url=vllm_server.base_url, model_dir=vllm_server.model_dir)
    assert isinstance(syncer, ReloadWeightSyncer)
    yield syncer
    syncer.close()


def test_chat_returns_token_ids_and_logprobs(
    vllm_server: VllmServer, tokenizer: PreTrainedTokenizerBase, trainer_model: PreTrainedModel
) -> None:
    choice = _chat(vllm_server)
    assert choice["prompt_token_ids"] == tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_dict=False)
    assert 0 < len(choice["token_ids"]) == len(choice["logprobs"]["content"]) <= 12
    assert _sampled_logprobs_match(trainer_model, choice) < AGREE


def test_completions_take_token_ids_and_sample_n(vllm_server: VllmServer, tokenizer: PreTrainedTokenizerBase) -> None:
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    body = {"model": vllm_server.model_name, "prompt": prompt, "max_tokens": 8, "n": 4, "temperature": 1.0,
            "seed": 0, "logprobs": 0, "return_token_ids": True}
    response = httpx.post(f"{vllm_server.api_url}/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == 4
    for choice in choices:
        assert choice["prompt_token_ids"] == prompt
        assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"])


def test_probe_agrees_with_the_trainer(
    vllm_server: VllmServer, tokenizer: PreTrainedTokenizerBase, trainer_model: PreTrainedModel
) -> None:
    token_ids = probe_token_ids(tokenizer)
    assert 100 < len(token_ids) < vllm_server.max_model_len
    report = verify_sync(model=trainer_model, api_url=vllm_server.api_url, model_name=vllm_server.model_name,
                         token_ids=token_ids, tolerance=AGREE)
    assert report.tokens == len(token_ids) - 1
    assert report.max_abs_diff < 10 * AGREE and abs(report.kl) < AGREE


def test_verify_sync_names_the_mismatch(
    vllm_server: VllmServer, tokenizer: PreTrainedTokenizerBase, trainer_model: PreTrainedModel
) -> None:
    stale = _perturbed(trainer_model, seed=2)  # trained, never pushed
    with pytest.raises(WeightSyncError, match=r"mean \|Δlogprob\| [0-9.e-]+, max .* over \d+ tokens"):
        verify_sync(model=stale, api_url=vllm_server.api_url, model_name=vllm_server.model_name,
                    token_ids=probe_token_ids(tokenizer))


def test_push_moves_the_server_to_the_new_weights(
    vllm_server: VllmServer, tokenizer: PreTrainedTokenizerBase, trainer_model: PreTrainedModel,
    syncer: ReloadWeightSyncer,
) -> None:
    kwargs: dict[str, Any] = {"api_url": vllm_server.api_url, "model_name": vllm_server.model_name,
              "token_ids": probe_token_ids(tokenizer)}
    new = _perturbed(trainer_model, seed=1)
    before_chat = _chat(vllm_server)  # also fills the prefix cache with old-weight KV
    assert probe(model=new, **kwargs).mean_abs_diff > DISAGREE  # the server still runs the old weights

    try:
        seconds = syncer.push(model=new, label=Label.fresh(1, run=None))
        assert seconds > 0
        after = verify_sync(model=new, tolerance=AGREE, **kwargs)
        assert after.max_abs_diff < 10 * AGREE
        assert probe(model=trainer_model, **kwargs).mean_abs_diff > DISAGREE  # and no longer the old ones
        # Generation too, with the same prompt as before the push: no stale cached KV is reused.
        after_chat = _chat(vllm_server)
        assert _sampled_logprobs_match(new, after_chat) < AGREE
        assert _sampled_logprobs_match(trainer_model, before_chat) < AGREE
        assert (label := Label.parse(syncer.control.version())) is not None and (label.version, label.provisional) == (1, False)
        assert httpx.get(f"{vllm_server.base_url}/is_paused").json() == {"is_paused": False}
        assert sorted(p.name for p in vllm_server.model_dir.glob(".weights-*")) == []  # no temp file left
    finally:
        syncer.push(model=trainer_model, label=Label.fresh(2, run=None))
    verify_sync(model=trainer_model, tolerance=AGREE, **kwargs)


def test_push_keeps_in_flight_requests(
    vllm_server: VllmServer, tokenizer: PreTrainedTokenizerBase, trainer_model: PreTrainedModel,
    syncer: ReloadWeightSyncer,
) -> None:
    """`/pause?mode=keep`: a request streaming during the push finishes whole instead of being aborted."""
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    body = {"model": vllm_server.model_name, "prompt": prompt, "max_tokens": 400, "ignore_eos": True,
            "temperature": 1.0, "stream": True, "return_token_ids": True}
    token_ids: list[int] = []
    finish_reasons = []
    tokens_at_push = None
    try:
        with httpx.stream("POST", f"{vllm_server.api_url}/completions", json=body, timeout=120) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choice = json.loads(line.removeprefix("data: "))["choices"][0]
                token_ids += choice.get("token_ids") or []
                finish_reasons.append(choice.get("finish_reason"))
                if tokens_at_push is None:  # the first chunk arrived: the request is running now
                    tokens_at_push = len(token_ids)
                    syncer.push(model=_perturbed(trainer_model, seed=3), label=Label.fresh(3, run=None))
    finally:
        syncer.push(model=trainer_model, label=Label.fresh(4, run=None))
    assert tokens_at_push is not None and tokens_at_push < 400
    assert len(token_ids) == 400 and finish_reasons[-1] == "length"


def test_a_sync_in_the_middle_of_a_completion_is_labelled_at_the_token_it_took_effect(
    vllm_server: VllmServer, tokenizer: PreTrainedTokenizerBase, trainer_model: PreTrainedModel,
    syncer: ReloadWeightSyncer,
) -> None:
    """(I3, issue 23) One completion on vLLM's token-in/token-out route while the trainer pushes new weights:
    the stored versions switch at one token offset, and each span's logprobs are those of its own
    version's weights (≤ 1e-3), not the other's. Tokens sampled under the provisional label count as the
    new version once it is committed (settled by the worker's loop)."""
    from core.schemas.run import Sampling
    from core.token_versions import decode
    from environments.spec import Limits
    from task_workers.episode.loop import LoopContext, _versions
    from task_workers.policy.client import PolicyClient, sampling_body

    syncer.control.set_version(10)  # the weights served now are version 10, verified
    client = PolicyClient(base_url=vllm_server.api_url, model=vllm_server.model_name)
    prompt = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False))
    # As many tokens as the server allows: each span hundreds of tokens, and a completion long enough that
    # the first pause lands inside it (a fast machine once sampled all of 1,024 before the pause landed).
    params = {**sampling_body(Sampling(temperature=1.0)), "max_tokens": vllm_server.max_model_len - len(prompt) - 8,
              "ignore_eos": True, "logprobs": 0, "skip_special_tokens": False}
    new = _perturbed(trainer_model, seed=5)
    result: dict[str, Any] = {}

    def sample() -> None:
        result["completion"] = client._generate(prompt, params, started=time.monotonic())

    # Tokens are sampled faster than vLLM's /metrics can be polled, so the sync's moment is found by
    # pausing: start the completion, wait, pause (keep). Paused with at least MIN_SPAN tokens sampled by
    # version 10 and the completion far from its end: the sync lands inside it, and each version's span is
    # long enough for its logprobs to tell the two weights apart (one token of each once read 0.046, under
    # DISAGREE, by chance). Paused too early: resume the same completion (no version changed) and wait
    # twice as long. Ended first: a new completion, from the shortest wait again.
    trials: list[tuple[float, float, bool]] = []
    for _ in range(6):  # a fast, quiet machine can end a completion before the first pause: try again
        result.clear()
        before = _generated_tokens(vllm_server)
        worker = threading.Thread(target=sample)
        worker.start()
        delay, landed = 0.01, False
        while True:
            time.sleep(delay)
            syncer.control.pause()
            sampled = _generated_tokens(vllm_server) - before
            running = worker.is_alive()
            trials.append((delay, sampled, running))
            # (the counter may trail the engine by a step or two: a margin, so "not ended" is sure)
            if not running or sampled >= params["max_tokens"] - 2 * MIN_SPAN:
                break
            if sampled >= MIN_SPAN:
                landed = True
                break
            syncer.control.resume()
            delay *= 2
        if landed:
            break
        syncer.control.resume()
        worker.join(300)
    else:
        pytest.fail(f"no pause landed inside a completion: (wait s, tokens, running) {trials}")
    try:
        syncer.push(model=new, label=Label.fresh(11, run=None))  # reload → "11-unverified#…" → resume → "11#…"
        worker.join(300)
        completion = result["completion"]
        labels = [label for label, _, _ in completion.spans]
        versions = [Label.parse(label).version for label in labels]  # type: ignore[union-attr]  # None fails the test
        assert versions[0] == 10 and len(labels) >= 2 and all(version == 11 for version in versions[1:]), labels
        switch = completion.spans[1][1]
        tokens = completion.token_ids
        assert MIN_SPAN <= switch <= len(tokens) - MIN_SPAN, (switch, len(tokens))
        ctx = LoopContext(kind=None, task=None, sandbox=None, policy=client, limits=Limits(),  # type: ignore[arg-type]
                          sampling=Sampling(temperature=1.0), require_version=True)
        stored = _versions(ctx, completion)
        assert decode(stored.runs or [], length=len(tokens)) == [10] * switch + [11] * (len(tokens) - switch)
        old = trainer_logprobs(model=trainer_model, token_ids=prompt + tokens)[len(prompt) - 1:]
        moved = trainer_logprobs(model=new, token_ids=prompt + tokens)[len(prompt) - 1:]
        served = completion.logprobs
        for span, own, other in ((slice(0, switch), old, moved), (slice(switch, len(tokens)), moved, old)):
            mine = [abs(a - b) for a, b in zip(served[span], own[span], strict=True)]
            theirs = [abs(a - b) for a, b in zip(served[span], other[span], strict=True)]
            assert max(mine) <= 1e-3, (span, max(mine))
            assert sum(theirs) / len(theirs) > DISAGREE, (span, sum(theirs) / len(theirs))
    finally:
        worker.join(300)
        client.close()
        syncer.push(model=trainer_model, label=Label.fresh(12, run=None))


def _generated_tokens(server: VllmServer) -> float:
    """vLLM's `vllm:generation_tokens_total` counter: tokens sampled since the server started."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))
