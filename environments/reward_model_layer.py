"""The `reward_model` verifier layer: a preference reward model (`crucible rm train`, served by
`crucible rm serve`) scores the episode.

    layer = score_episode(config, prompt=instruction, response=render_turns(turns))

The prompt is the task's instruction and the response the episode's turns rendered exactly as
`crucible rm train --run` mined them (core.episode_text.render_turns), so the model scores what it was
trained on. The raw Bradley–Terry reward R is unbounded; the layer's score is σ(R) in (0, 1)
and the record keeps R, the server and the latency. A server that does not answer after the retries
is an infrastructure fault (`RewardModelUnavailable`: the episode is retried), never a zero reward.
"""

from __future__ import annotations

import math
import time

import httpx

from core.settings import get_settings, public_url
from environments.base import LayerResult
from environments.judge import LearnedRewardUnavailable
from environments.spec import RewardModelConfig

LAYER = "reward_model"


class RewardModelUnavailable(LearnedRewardUnavailable):
    """The reward model server did not answer (or answered 5xx/429) after every retry."""


def score_episode(config: RewardModelConfig, *, prompt: str, response: str,
                  client: httpx.Client | None = None) -> LayerResult:
    own = client is None
    token = get_settings().api_token  # `crucible rm serve` asks for the API's bearer tokens
    http = client or httpx.Client(timeout=config.timeout_s,
                                  headers={"Authorization": f"Bearer {token}"} if token else None)
    url = f"{config.url.rstrip('/')}/score"
    failure = ""
    started = time.monotonic()
    try:
        for attempt in range(config.retries + 1):
            try:
                answer = http.post(url, json={"items": [{"prompt": prompt, "response": response}]})
            except httpx.HTTPError as error:
                failure = f"{type(error).__name__}: {error}"
            else:
                if answer.status_code < 400:
                    try:
                        raw = float(answer.json()["scores"][0])
                    except (ValueError, KeyError, IndexError, TypeError) as error:
                        failure = f"a malformed answer: {error!r}"
                    else:
                        if math.isfinite(raw):
                            return _layer(config, raw=raw, seconds=time.monotonic() - started)
                        failure = f"a non-finite score {raw}"
                elif answer.status_code >= 500 or answer.status_code == 429:
                    failure = f"HTTP {answer.status_code}: {answer.text[:300]}"
                elif answer.status_code in (401, 403):  # the worker's configuration: a fault, never a zero
                    raise RewardModelUnavailable(
                        f"reward model {public_url(config.url)} refused this worker's token (HTTP {answer.status_code}): "
                        "CRUCIBLE_API_TOKEN: expected a live API token of the reward model's store, got "
                        f"{'none' if not token else 'one it refuses'}")
                else:  # the request's own fault (too long for the server): a layer result, not a retry
                    why = f"the reward model refused the episode: HTTP {answer.status_code}: {answer.text[:300]}"
                    return LayerResult(LAYER, 0.0, False, why, time.monotonic() - started,
                                       record={"server": public_url(config.url), "raw": None, "error": why})
            if attempt < config.retries:
                time.sleep(min(0.5 * 2**attempt, 5.0))
    finally:
        if own:
            http.close()
    raise RewardModelUnavailable(f"reward model {public_url(config.url)} did not answer after "
                                 f"{config.retries + 1} tries: {failure}")


def _layer(config: RewardModelConfig, *, raw: float, seconds: float) -> LayerResult:
    score = 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, raw))))
    return LayerResult(LAYER, score, score >= config.pass_threshold, f"R = {raw:.4g}, σ(R) = {score:.3f}", seconds,
                       record={"server": public_url(config.url), "raw": raw, "score": score,
                               "seconds": round(seconds, 4), "error": None})
