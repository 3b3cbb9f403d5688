"""A client for vLLM's OpenAI-compatible server that works in token ids end to end.

The prompt of every turn is the exact token sequence of the previous turns plus the environment's
new tokens (never a re-rendered chat), so the trainer trains on exactly what was sampled. Requests
ask for `return_token_ids` and logprobs (the server runs with `--logprobs-mode processed_logprobs`).
Transient failures are retried with exponential backoff; then `PolicyError`, an infrastructure fault.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from task_workers.policy.chat import IM_END

logger = logging.getLogger(__name__)


class PolicyError(RuntimeError):
    """The policy server failed or did not answer: an infrastructure fault, retried elsewhere."""


class ContextOverflow(PolicyError):
    """The prompt plus the response would not fit the model's context."""


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # (T,) behaviour logprob of each sampled token
    text: str
    finish_reason: str | None
    weight_version: str | None
    seconds: float


class PolicyClient:
    def __init__(
        self, *, base_url: str, model: str | None = None, timeout_s: float = 120.0, retries: int = 3,
        backoff_s: float = 0.5, transport: httpx.BaseTransport | None = None,
        tokenizer: Callable[[str], list[int]] | None = None,
    ) -> None:
        """`tokenizer`: the served model's own tokenizer, loaded locally, saves a round trip per turn
        for environment text; without it `/tokenize` is asked (the same tokenizer, over HTTP)."""
        root = base_url.removesuffix("/").removesuffix("/v1")
        self._http = httpx.Client(base_url=root, timeout=timeout_s, transport=transport)
        self._model = model
        self._retries = retries
        self._backoff_s = backoff_s
        self._tokenizer = tokenizer
        self._end_of_turn: int | None = None

    def close(self) -> None:
        self._http.close()

    def model(self) -> str:
        if self._model is None:
            self._model = str(self._request("GET", "/v1/models")["data"][0]["id"])
        return self._model

    def tokenize_chat(self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The rendered chat template (with a generation prompt) as token ids."""
        body = {"model": self.model(), "messages": messages, "add_generation_prompt": True, "tools": tools or None}
        return list(self._request("POST", "/tokenize", json=body)["tokens"])

    def tokenize(self, text: str) -> list[int]:
        if self._tokenizer is not None:
            return self._tokenizer(text)
        body = {"model": self.model(), "prompt": text, "add_special_tokens": False}
        return list(self._request("POST", "/tokenize", json=body)["tokens"])

    def end_of_turn_id(self) -> int:
        """The token that closes a chat turn (<|im_end|>): a completion that stopped on it is closed."""
        if self._end_of_turn is None:
            ids = self.tokenize(IM_END)
            if len(ids) != 1:
                raise PolicyError(f"expected {IM_END} to be one token of the served model, got {ids}")
            self._end_of_turn = ids[0]
        return self._end_of_turn

    def weight_version(self) -> str | None:
        try:
            return str(self._request("GET", "/weight_info", retry=False)["weight_version"])
        except PolicyError:
            return None  # servers without the RL dev endpoints: versions are tracked by the run instead

    def complete(
        self, *, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
        seed: int | None = None,
    ) -> Completion:
        body: dict[str, Any] = {
            "model": self.model(), "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": temperature,
            "top_p": top_p, "logprobs": 0, "return_token_ids": True, "skip_special_tokens": False,
        }
        if seed is not None:
            body["seed"] = seed
        started = time.monotonic()
        data = self._request("POST", "/v1/completions", json=body)
        choice = data["choices"][0]
        token_ids = list(choice.get("token_ids") or [])
        logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        if len(logprobs) != len(token_ids):
            raise PolicyError(f"the server returned {len(token_ids)} token ids but {len(logprobs)} logprobs")
        return Completion(
            token_ids=token_ids, logprobs=logprobs, text=choice.get("text", ""),
            finish_reason=choice.get("finish_reason"), weight_version=self.weight_version(),
            seconds=time.monotonic() - started,
        )

    def _request(self, method: str, path: str, *, json: Any = None, retry: bool = True) -> Any:
        attempts = self._retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                response = self._http.request(method, path, json=json)
            except httpx.TransportError as error:
                failure = f"{method} {path}: {error!r}"
            else:
                if response.status_code < 400:
                    return response.json()
                failure = f"{method} {path}: HTTP {response.status_code} {response.text[:300]}"
                if response.status_code == 400 and "context" in response.text.lower():
                    raise ContextOverflow(failure)
                if response.status_code < 500 and response.status_code != 429:
                    raise PolicyError(failure)
            if attempt + 1 < attempts:
                delay = self._backoff_s * 2**attempt
                logger.warning("policy request failed (%s); retrying in %.1fs", failure, delay)
                time.sleep(delay)
        raise PolicyError(failure)


def local_tokenizer(model_dir: str) -> Callable[[str], list[int]]:
    """The model directory's tokenizer as a function (no special tokens added, like `/tokenize`)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False))
