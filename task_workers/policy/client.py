"""A client for vLLM's OpenAI-compatible server that works in token ids end to end.

The prompt of every turn is the exact token sequence of the previous turns plus the environment's
new tokens (never a re-rendered chat), so the trainer trains on exactly what was sampled. Requests
ask for `return_token_ids` and logprobs (the server runs with `--logprobs-mode processed_logprobs`).
Transient failures are retried with exponential backoff; then `PolicyError`, an infrastructure fault.

Every completion request sends the full sampling set (`core.schemas.run.Sampling`: top_k −1, min_p 0,
neutral penalties unless the run says otherwise), so no server or model default can change the
distribution the trainer reproduces.

Weight versions: vLLM's token-in/token-out route (`/inference/v1/generate`, served with
`--enable-scale-out`) labels every span of output tokens with the weight version that sampled it
(`[start, end)` over the output); the client keeps the spans when the server has them. Elsewhere
(`/v1/completions`) the version is read before the request and after it: the turn was sampled by
weights between the two, and every token is labelled with the one read before (the oldest that can
have sampled it; a sync during such a request is seen, `versions` differ, but not where it fell).

Environment text is tokenized with special tokens split: a tool that prints `<|im_end|>` adds
plain-text tokens, never a control token that would end the tool message.

The turn frame comes from the served model's own chat template: the client learns its family once
(`renderer`, core/renderers.py) from a probe conversation the server renders (`/tokenize` with
messages, then `/detokenize`), which works for any server, local or remote; vLLM has no route for the
raw template. The family's end-of-turn tokens, control strings and frame follow from it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from core.renderers import (
    PROBE_EXCHANGE,
    PROBE_MESSAGES,
    RENDERERS,
    Renderer,
    renderer_for,
    split_control_strings,
)
from core.schemas.run import Sampling

logger = logging.getLogger(__name__)
GENERATE_ROUTE = "/inference/v1/generate"


class PolicyError(RuntimeError):
    """The policy server failed or did not answer: an infrastructure fault, retried elsewhere."""


class ContextOverflow(PolicyError):
    """The prompt plus the response would not fit the model's context."""


class ReplicaUnavailable(PolicyError):
    """The server did not answer, or answered 5xx/429, after every retry: the server is at fault, not the
    request, so a pool of replicas sends the request to another one (task_workers/policy/pool.py)."""


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # (T,) behaviour logprob of each sampled token
    text: str
    finish_reason: str | None
    versions: tuple[str | None, ...]
    """Every weight-version label that sampled the output, in order: vLLM's per-token spans where it
    reports them, else the server's version before and after the request (a bracket)."""
    version_after: str | None
    """The server's version once the completion returned: says whether weights that were still being
    probed (a provisional label) were verified since."""
    seconds: float
    prompt_ids: tuple[int, ...] | None = None
    """The prompt the server says it sampled from (vLLM's `prompt_token_ids`); None when not echoed."""
    replica: str | None = None
    """The pool replica that sampled it (task_workers/policy/pool.py); None from a lone client."""
    spans: tuple[tuple[str | None, int, int], ...] = ()
    """(label, start, end): output tokens [start, end) were sampled by weights labelled `label`. From
    vLLM's spans where it reports them; else one span over the whole output, labelled with the version
    read before the request. Empty for an empty output."""

    @property
    def version_start(self) -> str | None:
        """The oldest weights that can have sampled it."""
        return self.versions[0] if self.versions else None

    @property
    def version_end(self) -> str | None:
        """The newest weights that can have sampled it."""
        return self.versions[-1] if self.versions else None


class PolicyClient:
    def __init__(
        self, *, base_url: str, model: str | None = None, timeout_s: float = 120.0, retries: int = 3,
        backoff_s: float = 0.5, transport: httpx.BaseTransport | None = None,
        tokenizer: Callable[[str], list[int]] | None = None,
        plain_tokenizer: Callable[[str], list[int]] | None = None, renderer: Renderer | None = None,
    ) -> None:
        """`tokenizer` / `plain_tokenizer`: the served model's own tokenizer, loaded locally, with
        special tokens parsed / split (`local_tokenizers`); saves a round trip per turn for
        environment text. Without them `/tokenize` is asked (the same tokenizer, over HTTP).
        `renderer`: the served template's family when known; else learned from the server once."""
        root = base_url.removesuffix("/").removesuffix("/v1")
        self._http = httpx.Client(base_url=root, timeout=timeout_s, transport=transport)
        self._model = model
        self._retries = retries
        self._backoff_s = backoff_s
        self._tokenizer = tokenizer
        self._plain_tokenizer = plain_tokenizer
        self._renderer = renderer
        self._end_of_turn: tuple[int, ...] | None = None
        self._generate_route: bool | None = None  # None: not tried yet

    def close(self) -> None:
        self._http.close()

    @property
    def labels_every_token(self) -> bool:
        """The server labels each output span with its weight version (vLLM's generate route)."""
        return self._generate_route is True

    def model(self) -> str:
        if self._model is None:
            self._model = str(self._request("GET", "/v1/models")["data"][0]["id"])
        return self._model

    def tokenize_chat(self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The rendered chat template (with a generation prompt) as token ids."""
        body = {"model": self.model(), "messages": messages, "add_generation_prompt": True, "tools": tools or None}
        return list(self._request("POST", "/tokenize", json=body)["tokens"])

    def tokenize(self, text: str) -> list[int]:
        """`text` with its special-token strings parsed as control tokens: for the chat frame only."""
        if self._tokenizer is not None:
            return self._tokenizer(text)
        return self._tokenize_remote(text)

    def tokenize_plain(self, text: str) -> list[int]:
        """`text` as plain text: a special-token string in it (a tool printed `<|im_end|>`) becomes
        ordinary text tokens, never the control token."""
        if self._plain_tokenizer is not None:
            return self._plain_tokenizer(text)
        # vLLM's /tokenize cannot split special tokens: cut every control string in two, so that
        # no segment holds one whole. Text without control strings is one call, as before.
        ids: list[int] = []
        for segment in split_control_strings(text, self.renderer().control_strings):
            ids += self.tokenize(segment) if segment else []
        return ids

    def _tokenize_remote(self, text: str) -> list[int]:
        body = {"model": self.model(), "prompt": text, "add_special_tokens": False}
        return list(self._request("POST", "/tokenize", json=body)["tokens"])

    def renderer(self) -> Renderer:
        """The served chat template's family, learned once from a probe conversation it renders. A server
        whose detokenizer drops control tokens is asked instead which family's markers are single tokens
        of its model."""
        if self._renderer is None:
            try:  # a template that refuses the exchange (its own checks) is read from the plain probe
                tokens = self.tokenize_chat(messages=PROBE_EXCHANGE, tools=None)
            except PolicyError:
                tokens = self.tokenize_chat(messages=PROBE_MESSAGES, tools=None)
            body = {"model": self.model(), "tokens": tokens}
            rendered = str(self._request("POST", "/detokenize", json=body)["prompt"])
            try:
                self._renderer = renderer_for(rendered)
            except ValueError as error:
                found = [r for r in RENDERERS.values()
                         if all(len(self.tokenize(marker)) == 1 for marker in (*r.markers, r.end_of_turn[0]))]
                if len(found) != 1:
                    raise PolicyError(f"the served model's {error}") from None
                self._renderer = found[0]
            logger.info("the served chat template is of the %s family", self._renderer.family)
        return self._renderer

    def end_of_turn_ids(self) -> tuple[int, ...]:
        """The tokens that close a chat turn (<|im_end|>; <|eot_id|> and <|eom_id|>): a completion that
        stopped on one is closed. The family's first must be one token of the served model; the others
        count where they are one."""
        if self._end_of_turn is None:
            ids = [self.tokenize(text) for text in self.renderer().end_of_turn]
            if len(ids[0]) != 1:
                raise PolicyError(f"expected {self.renderer().end_of_turn[0]} to be one token of the served model, "
                                  f"got {ids[0]}")
            self._end_of_turn = tuple(one[0] for one in ids if len(one) == 1)
        return self._end_of_turn

    def end_of_turn_id(self) -> int:
        """The token a turn cut by `max_tokens` is closed with (the family's first end of turn)."""
        return self.end_of_turn_ids()[0]

    def weight_version(self) -> str | None:
        try:
            return str(self._request("GET", "/weight_info", retry=False)["weight_version"])
        except PolicyError:
            return None  # servers without the RL dev endpoints: versions are tracked by the run instead

    def complete(
        self, *, prompt_ids: list[int], max_tokens: int, sampling: Sampling | None = None, seed: int | None = None,
    ) -> Completion:
        params: dict[str, Any] = {"max_tokens": max_tokens, **sampling_body(sampling or Sampling()), "logprobs": 0,
                                  "skip_special_tokens": False}
        if seed is not None:
            params["seed"] = seed
        started = time.monotonic()
        if self._generate_route is not False:
            generated = self._generate(prompt_ids, params, started=started)
            if generated is not None:
                return generated
        version_start = self.weight_version()
        data = self._request("POST", "/v1/completions",
                             json={"model": self.model(), "prompt": prompt_ids, "return_token_ids": True, **params})
        version_end = self.weight_version()
        choice = data["choices"][0]
        logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        count = len(choice.get("token_ids") or [])
        return _completion({"prompt_token_ids": data.get("prompt_token_ids"), **choice}, logprobs,
                           versions=(version_start, version_end), after=version_end, started=started,
                           spans=((version_start, 0, count),) if count else ())

    def _generate(self, prompt_ids: list[int], params: dict[str, Any], *, started: float) -> Completion | None:
        """vLLM's token-in/token-out route with per-token weight-version spans; None where the server
        does not serve it (then `/v1/completions` is used from now on)."""
        body = {"model": self.model(), "token_ids": prompt_ids, "output_mode": "text",
                "sampling_params": {**params, "detokenize": True}}
        data = self._request("POST", GENERATE_ROUTE, json=body, missing_ok=True)
        if data is None:
            self._generate_route = False
            return None
        self._generate_route = True
        choice = data["choices"][0]
        logprobs = [float(entry["logprob"]) for entry in (choice.get("logprobs") or {}).get("content") or []]
        try:
            spans = tuple((str(span["version"]), int(span["start"]), int(span["end"]))
                          for span in choice.get("weight_versions") or [])
        except (KeyError, TypeError, ValueError) as error:
            raise PolicyError(f"the server's weight-version spans are malformed: {error!r}, got "
                              f"{str(choice.get('weight_versions'))[:300]}") from error
        after = self.weight_version()
        versions = tuple(label for label, _, _ in spans) or (after,)  # none: an empty output
        choice = {"prompt_token_ids": data.get("prompt_token_ids"), **choice}
        return _completion(choice, logprobs, versions=versions, after=after, started=started, spans=spans)

    def _request(self, method: str, path: str, *, json: Any = None, retry: bool = True, missing_ok: bool = False
                 ) -> Any:
        """The JSON answer; `missing_ok`: None when the server has no such route (404, or 403 for
        vLLM's scale-out routes when they are not enabled)."""
        attempts = self._retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                response = self._http.request(method, path, json=json)
            except httpx.TransportError as error:
                failure = f"{method} {path}: {error!r}"
            else:
                if response.status_code < 400:
                    return response.json()
                if missing_ok and response.status_code in (403, 404):
                    return None
                failure = f"{method} {path}: HTTP {response.status_code} {response.text[:300]}"
                if response.status_code == 400 and "context" in response.text.lower():
                    raise ContextOverflow(failure)
                if response.status_code < 500 and response.status_code != 429:
                    raise PolicyError(failure)
            if attempt + 1 < attempts:
                delay = self._backoff_s * 2**attempt
                logger.warning("policy request failed (%s); retrying in %.1fs", failure, delay)
                time.sleep(delay)
        raise ReplicaUnavailable(failure)  # a request's own faults (4xx) were raised above


def _completion(choice: dict[str, Any], logprobs: list[float], *, versions: tuple[str | None, ...],
                after: str | None, started: float, spans: tuple[tuple[str | None, int, int], ...]) -> Completion:
    token_ids = list(choice.get("token_ids") or [])
    if len(logprobs) != len(token_ids):
        raise PolicyError(f"the server returned {len(token_ids)} token ids but {len(logprobs)} logprobs")
    echoed = choice.get("prompt_token_ids")
    return Completion(token_ids=token_ids, logprobs=logprobs, text=choice.get("text", ""),
                      finish_reason=choice.get("finish_reason"), versions=versions, version_after=after,
                      seconds=time.monotonic() - started, spans=spans,
                      prompt_ids=tuple(echoed) if isinstance(echoed, list) else None)


def sampling_body(sampling: Sampling) -> dict[str, Any]:
    """Every sampling parameter vLLM applies, spelled out (a missing one would take the server's or
    the model's `generation_config.json` default, which the trainer does not reproduce)."""
    return sampling.model_dump()


def local_tokenizer(model_dir: str) -> Callable[[str], list[int]]:
    """The model directory's tokenizer as a function (no special tokens added, like `/tokenize`)."""
    return local_tokenizers(model_dir)[0]


def local_tokenizers(model_dir: str) -> tuple[Callable[[str], list[int]], Callable[[str], list[int]]]:
    """The model directory's tokenizer as two functions: special tokens parsed (the chat frame) and
    split (environment text, `split_special_tokens=True`). Neither adds BOS/EOS, like `/tokenize`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return (lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
            lambda text: list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)))
