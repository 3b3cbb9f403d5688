"""Check that vLLM serves the trainer's weights: score one fixed token sequence on both sides.

The trainer scores the probe teacher-forced with torch; vLLM scores the same token ids as a
completions prompt with `prompt_logprobs=0` (the logprob of each prompt token given its prefix).
After a weight push the two must agree within the served dtype's tolerance (`probe_tolerance`): float32
on both sides agree to ~1e-6 per token, a bf16 server to ~3e-3.

    ids = probe_token_ids(tokenizer)
    report = verify_sync(model=model, api_url=server.api_url, model_name=server.model_name, token_ids=ids,
                         tolerance=probe_tolerance("bfloat16"))   # the server's --dtype; float32 by default
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import httpx
import torch
from transformers import PreTrainedTokenizerBase

from core.errors import ConfigError
from core.schemas.run import Sampling
from trainer.errors import WeightSyncError

# A short tool-use episode: it covers the chat template, tool-call framing, code and prose tokens.
PROBE_TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
PROBE_MESSAGES: list[Any] = [
    {"role": "system", "content": "You fix failing tests in a repository."},
    {"role": "user", "content": "The test test_add fails. Find out why."},
    {"role": "assistant", "content": "Let me look at the code.", "tool_calls": [
        {"type": "function", "function": {"name": "bash", "arguments": {"command": "cat src/math_utils.py"}}}]},
    {"role": "tool", "content": "def add(a, b):\n    return a - b\n"},
    {"role": "assistant", "content": "The function subtracts instead of adding."},
]
# The probe's tolerance (mean |Δ logprob| per token, nats) by the dtype vLLM serves in; the trainer scores
# in float32. It must pass the rounding of the served dtype and fail weights other than those pushed: a
# wrong or half-loaded checkpoint moves the probe by 0.1 nats or more, a single small step by less, so
# the looser a dtype's tolerance, the smaller the step it can no longer tell from the one before.
# - float32: measured ≤ 1e-6; 1e-3 is the check's own margin.
# - bfloat16: measured ~3e-3 (8 significant bits: unit roundoff 2⁻⁸ ≈ 3.9e-3 in every weight and
#   activation); 1e-2 leaves about 3× headroom for longer sequences and larger models.
# - float16: 11 significant bits, 8× finer than bfloat16: ~4e-4 expected (not measured here); 2e-3 is
#   about 5× that.
TOLERANCES = {torch.float32: 1e-3, torch.bfloat16: 1e-2, torch.float16: 2e-3}
_DTYPE_NAMES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16, "half": torch.float16}  # vLLM's --dtype spellings


def probe_tolerance(dtype: str | torch.dtype) -> float:
    """The probe's tolerance for a server serving in `dtype` (vLLM's `--dtype` name or a torch dtype);
    ConfigError for `auto` (the served dtype must be named) or a dtype without a measured bound."""
    resolved = _DTYPE_NAMES.get(dtype) if isinstance(dtype, str) else dtype
    if resolved not in TOLERANCES:
        raise ConfigError(f"probe tolerance: expected float32, bfloat16 or float16 (the dtype vLLM serves in), "
                          f"got {str(dtype)!r}")
    return TOLERANCES[resolved]


DEFAULT_TOLERANCE = probe_tolerance(torch.float32)
"""A float32 server's: what `crucible serve` runs by default."""


@dataclass(frozen=True)
class ProbeReport:
    """How far vLLM's probe logprobs are from the trainer's (nats, per scored token)."""

    tokens: int
    mean_abs_diff: float
    max_abs_diff: float
    kl: float
    """k3 estimate of KL(trainer ‖ server) on the probe tokens: mean(e^d − 1 − d), d = server − trainer.
    The probe is fixed text, not a sample of either policy, so read it as a score, not an exact KL."""

    def __str__(self) -> str:
        return (f"mean |Δlogprob| {self.mean_abs_diff:.3g}, max {self.max_abs_diff:.3g}, "
                f"KL≈{self.kl:.3g} over {self.tokens} tokens")


def probe_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The fixed probe: the probe episode rendered by the model's own chat template."""
    ids = tokenizer.apply_chat_template(PROBE_MESSAGES, tools=PROBE_TOOLS, tokenize=True, return_dict=False)
    return [int(i) for i in cast(list[int], ids)]  # tokenize=True, return_dict=False: one flat list


@torch.no_grad()
def trainer_logprobs(*, model: torch.nn.Module, token_ids: list[int]) -> list[float]:
    """log p(token[t] | token[:t]) for t = 1..T-1, teacher-forced, in one forward pass."""
    was_training = model.training
    model.eval()  # no dropout: the server never applies it
    try:
        device = next(model.parameters()).device
        ids = torch.tensor([token_ids], device=device)  # (1, T)
        logits = model(input_ids=ids).logits.float()  # (1, T, V)
        logprobs = torch.log_softmax(logits[0, :-1], dim=-1)  # (T-1, V): position t predicts t+1
        picked = logprobs.gather(-1, ids[0, 1:, None])[:, 0]  # (T-1,)
    finally:
        model.train(was_training)
    return picked.cpu().tolist()


def server_logprobs(
    *, api_url: str, model_name: str, token_ids: list[int], timeout_s: float = 60.0
) -> list[float]:
    """vLLM's log p(token[t] | token[:t]) for t = 1..T-1, via completions `prompt_logprobs=0`."""
    body = {
        "model": model_name, "prompt": token_ids, "max_tokens": 1,
        **Sampling().model_dump(),  # every sampling parameter neutral: no server default may apply
        "prompt_logprobs": 0,  # 0: only the prompt token's own logprob, no top-k alternatives
    }
    try:
        response = httpx.post(f"{api_url.rstrip('/')}/completions", json=body, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise WeightSyncError(f"probe request to {api_url} failed: {error}") from error
    if response.status_code != 200:
        raise WeightSyncError(f"probe request: expected 200, got {response.status_code}: {response.text[:500]}")
    entries = response.json()["choices"][0]["prompt_logprobs"][1:]  # the first token has no prefix
    return [float(entry[str(token)]["logprob"]) for entry, token in zip(entries, token_ids[1:], strict=True)]


def compare_logprobs(*, trainer: list[float], server: list[float]) -> ProbeReport:
    if len(trainer) != len(server) or not trainer:
        raise WeightSyncError(f"expected two equal, non-empty logprob lists, got {len(trainer)} and {len(server)}")
    diffs = [s - t for t, s in zip(trainer, server, strict=True)]
    return ProbeReport(
        tokens=len(diffs),
        mean_abs_diff=sum(abs(d) for d in diffs) / len(diffs),
        max_abs_diff=max(abs(d) for d in diffs),
        kl=sum(math.expm1(d) - d for d in diffs) / len(diffs),
    )


def probe(*, model: torch.nn.Module, api_url: str, model_name: str, token_ids: list[int]) -> ProbeReport:
    """Score `token_ids` on both sides and compare."""
    return compare_logprobs(
        trainer=trainer_logprobs(model=model, token_ids=token_ids),
        server=server_logprobs(api_url=api_url, model_name=model_name, token_ids=token_ids),
    )


def verify_sync(
    *,
    model: torch.nn.Module,
    api_url: str,
    model_name: str,
    token_ids: list[int],
    tolerance: float = DEFAULT_TOLERANCE,
) -> ProbeReport:
    """The probe report, or WeightSyncError when the mean |Δlogprob| exceeds `tolerance`."""
    return verify_server(trainer=trainer_logprobs(model=model, token_ids=token_ids), api_url=api_url,
                         model_name=model_name, token_ids=token_ids, tolerance=tolerance)


def verify_server(
    *, trainer: list[float], api_url: str, model_name: str, token_ids: list[int],
    tolerance: float = DEFAULT_TOLERANCE,
) -> ProbeReport:
    """`verify_sync` with the trainer's side already scored: a pool scores it once for every replica."""
    report = compare_logprobs(
        trainer=trainer, server=server_logprobs(api_url=api_url, model_name=model_name, token_ids=token_ids))
    if not report.mean_abs_diff <= tolerance:  # `not <=` also catches NaN
        raise WeightSyncError(f"vLLM disagrees with the trainer's weights: {report} (tolerance {tolerance:g})")
    return report
