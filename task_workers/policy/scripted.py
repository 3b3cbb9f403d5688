"""A scripted policy server that speaks vLLM's OpenAI-compatible wire format, for deterministic tests
and benchmarks of everything around the model (it stands in for the model's choices, not for vLLM:
at least one test drives a real vLLM on CPU too).

Routes: /v1/models, /v1/completions (token-id prompts, `return_token_ids`, logprobs), /tokenize (text
or chat messages + tools), /detokenize, /weight_info, /update_weight_version, /is_paused (what
`paused` says; it pauses nothing), /health; with `generate=True` also vLLM's token-in/token-out
/inference/v1/generate, which spreads a reply's tokens evenly over its `delay_s` and labels each with
the version tagged when it was produced (`weight_versions` spans, as vLLM reports a completion that
a weight sync interrupted).

Tokens are bytes (0-255) plus ChatML specials. A task's instruction names its script with
`[script:NAME]`; turn k of an episode gets `scripts[NAME][k]` — a string, a `Reply`, or a callable.
A script may instead be `Samples`: one script per sample of a group, handed out in turn to the
episodes that start it (the k-th first request gets script k mod n); a sample's later turns find
theirs by the marker `[sample:K]`, which its first reply must carry (samples of one task that differ
in duration and outcome, as an agent's do).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from core.health import wait_healthy
from core.net import free_port
from environments.parsing import hermes_call

SPECIALS = {"<|im_start|>": 256, "<|im_end|>": 257, "<|endoftext|>": 258}
IDS_TO_SPECIAL = {v: k for k, v in SPECIALS.items()}
IM_END = SPECIALS["<|im_end|>"]
_SPECIAL_RE = re.compile("|".join(re.escape(s) for s in SPECIALS))
_SCRIPT_RE = re.compile(r"\[script:([\w.-]+)\]")


def tokenize(text: str) -> list[int]:
    ids: list[int] = []
    position = 0
    for match in _SPECIAL_RE.finditer(text):
        ids += list(text[position:match.start()].encode())
        ids.append(SPECIALS[match.group()])
        position = match.end()
    return ids + list(text[position:].encode())


def detokenize(ids: list[int]) -> str:
    out, pending = [], bytearray()
    for token in ids:
        if token in IDS_TO_SPECIAL:
            out.append(pending.decode(errors="replace"))
            pending = bytearray()
            out.append(IDS_TO_SPECIAL[token])
        else:
            pending.append(token)
    out.append(pending.decode(errors="replace"))
    return "".join(out)


def render_chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    text = ""
    for index, message in enumerate(messages):
        content = message.get("content") or ""
        if index == 0 and message["role"] == "system" and tools:
            content += "\n\n# Tools\n" + "\n".join(json.dumps(tool["function"]) for tool in tools)
        text += f"<|im_start|>{message['role']}\n{content}<|im_end|>\n"
    return text + "<|im_start|>assistant\n"


@dataclass(frozen=True)
class Reply:
    text: str
    delay_s: float = 0.0
    status: int = 200
    """A non-200 status answers with an error instead (a failing policy server)."""


Step = str | Reply | Callable[[str], "str | Reply"]


@dataclass(frozen=True)
class Samples:
    """One script per sample (see the module docstring); every first reply carries `[sample:K]`."""

    scripts: list[list[Step]]

    def marker(self, prompt: str) -> int:
        found = _SAMPLE_RE.search(prompt)
        return int(found.group(1)) % len(self.scripts) if found else 0


_SAMPLE_RE = re.compile(r"\[sample:(\d+)\]")


def _logprob(position: int) -> float:
    return -0.05 - 0.1 * (position % 7)


class ScriptedPolicy:
    def __init__(self, scripts: dict[str, list[Step] | Samples] | None = None, *, max_model_len: int = 16384,
                 generate: bool = False) -> None:
        self.scripts: dict[str, list[Step] | Samples] = dict(scripts or {})
        self._started: dict[str, int] = {}  # per Samples script: how many episodes started it
        self._lock = threading.Lock()
        self.max_model_len = max_model_len
        self.generate = generate
        self.weight_version = "0"
        self.requests = 0
        self.served: list[tuple[list[int], list[int]]] = []
        """(prompt ids, completion ids) of every completion answered, in order: what it served."""
        self.paused = False
        """What GET /is_paused reports (as vLLM's dev route); requests are served regardless."""
        self.app = self._build()

    def _reply(self, prompt: str) -> Reply:
        match = _SCRIPT_RE.search(prompt)
        name = match.group(1) if match else ""
        entry = self.scripts.get(name, [])
        turn = prompt.count("<|im_start|>assistant") - 1
        if isinstance(entry, Samples):
            if turn == 0:
                with self._lock:
                    index = self._started.get(name, 0)
                    self._started[name] = index + 1
                script = entry.scripts[index % len(entry.scripts)]
            else:
                script = entry.scripts[entry.marker(prompt)]
        else:
            script = entry
        step: Step = script[turn] if turn < len(script) else hermes_call("submit")
        if callable(step):
            step = step(prompt)
        return step if isinstance(step, Reply) else Reply(step)

    def _overflow(self, prompt_ids: list[int], max_tokens: int) -> JSONResponse | None:
        if len(prompt_ids) + max_tokens <= self.max_model_len:
            return None
        message = (f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                   f"requested {len(prompt_ids) + max_tokens} tokens.")
        return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": 400}}, 400)

    @staticmethod
    def _output(reply: Reply, max_tokens: int) -> tuple[list[int], str]:
        ids = [*tokenize(reply.text), IM_END]
        return (ids[:max_tokens], "length") if len(ids) > max_tokens else (ids, "stop")

    def _generate(self, body: dict[str, Any]) -> JSONResponse:
        """/inference/v1/generate: the reply's tokens produced one by one over its delay, each labelled
        with the version tagged at that moment; spans [start, end) per version, as vLLM's."""
        prompt_ids = list(body["token_ids"])
        max_tokens = int(body.get("sampling_params", {}).get("max_tokens") or 16)
        if (overflow := self._overflow(prompt_ids, max_tokens)) is not None:
            return overflow
        reply = self._reply(detokenize(prompt_ids))
        if reply.status != 200:
            time.sleep(reply.delay_s)
            return JSONResponse({"error": {"message": "scripted failure", "code": reply.status}}, reply.status)
        ids, finish = self._output(reply, max_tokens)
        self.served.append((list(prompt_ids), list(ids)))
        spans: list[dict[str, Any]] = []
        for position in range(len(ids)):
            if reply.delay_s:
                time.sleep(reply.delay_s / len(ids))
            version = self.weight_version
            if spans and spans[-1]["version"] == version:
                spans[-1]["end"] = position + 1
            else:
                spans.append({"version": version, "start": position, "end": position + 1})
        choice = {
            "index": 0, "text": detokenize(ids), "finish_reason": finish, "token_ids": ids,
            "logprobs": {"content": [{"logprob": _logprob(i)} for i in range(len(ids))]},
            "weight_versions": spans,
        }
        return JSONResponse({"id": f"gen-{self.requests}", "choices": [choice], "prompt_token_ids": prompt_ids})

    def _complete(self, body: dict[str, Any]) -> JSONResponse:
        prompt_ids = body["prompt"] if isinstance(body["prompt"], list) else tokenize(body["prompt"])
        max_tokens = int(body.get("max_tokens") or 16)
        if (overflow := self._overflow(prompt_ids, max_tokens)) is not None:
            return overflow
        reply = self._reply(detokenize(prompt_ids))
        if reply.delay_s:
            time.sleep(reply.delay_s)
        if reply.status != 200:
            return JSONResponse({"error": {"message": "scripted failure", "code": reply.status}}, reply.status)
        ids, finish = self._output(reply, max_tokens)
        self.served.append((list(prompt_ids), list(ids)))
        choice = {
            "index": 0, "text": detokenize(ids), "finish_reason": finish, "token_ids": ids,
            "prompt_token_ids": prompt_ids,
            "logprobs": {"token_logprobs": [_logprob(i) for i in range(len(ids))],
                         "tokens": [detokenize([t]) for t in ids], "text_offset": [], "top_logprobs": []},
        }
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids)}
        return JSONResponse({"id": f"cmpl-{self.requests}", "object": "text_completion", "model": "scripted",
                             "choices": [choice], "usage": usage})

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        def health() -> dict[str, str]:
            return {}

        @app.get("/v1/models")
        def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "scripted", "object": "model"}]}

        @app.post("/tokenize")
        async def tokenize_route(request: Request) -> dict[str, Any]:
            body = await request.json()
            text = render_chat(body["messages"], body.get("tools")) if "messages" in body else body["prompt"]
            tokens = tokenize(text)
            return {"tokens": tokens, "count": len(tokens), "max_model_len": self.max_model_len}

        @app.post("/detokenize")
        async def detokenize_route(request: Request) -> dict[str, str]:
            return {"prompt": detokenize((await request.json())["tokens"])}

        @app.get("/is_paused")
        def is_paused() -> dict[str, bool]:
            return {"is_paused": self.paused}

        @app.get("/weight_info")
        def weight_info() -> dict[str, str]:
            return {"weight_version": self.weight_version}

        @app.post("/update_weight_version")
        async def update_weight_version(request: Request) -> dict[str, Any]:
            self.weight_version = str((await request.json())["new_version"])
            return {"success": True, "new_version": self.weight_version}

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            self.requests += 1
            body = await request.json()
            # Run the (possibly sleeping) reply off the event loop so concurrent episodes overlap.
            import anyio

            return await anyio.to_thread.run_sync(self._complete, body)

        if self.generate:
            @app.post("/inference/v1/generate")
            async def generate(request: Request) -> JSONResponse:
                self.requests += 1
                body = await request.json()
                import anyio

                return await anyio.to_thread.run_sync(self._generate, body)

        return app


@contextmanager
def serve(policy: ScriptedPolicy) -> Iterator[str]:
    """Run the server on a loopback port in a thread; yields its base URL (…/v1)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(policy.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the scripted policy server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)


def main() -> None:
    """Serve scripts from a JSON file in its own process (benchmarks: the policy is not in our GIL).

        python -m task_workers.policy.scripted --scripts scripts.json --port 8011 [--host 0.0.0.0]
    """
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--scripts", required=True, help='JSON: {name: [reply text or {"text", "delay_s"}, ...] '
                        'or {"samples": [[...], ...]}}')
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (a container's: 0.0.0.0)")
    parser.add_argument("--generate", action="store_true", help="serve /inference/v1/generate with spans")
    args = parser.parse_args()
    def steps(raw: list[Any]) -> list[Step]:
        return [Reply(**step) if isinstance(step, dict) else step for step in raw]

    with open(args.scripts) as handle:
        scripts: dict[str, list[Step] | Samples] = {
            name: Samples([steps(one) for one in raw["samples"]]) if isinstance(raw, dict) else steps(raw)
            for name, raw in json.load(handle).items()}
    policy = ScriptedPolicy(scripts, generate=args.generate)
    uvicorn.run(policy.app, host=args.host, port=args.port, log_level="warning")


@contextmanager
def serve_in_process(scripts: dict[str, Any], *, generate: bool = False) -> Iterator[str]:
    """Like `serve`, but in a child process; steps are strings or {"text", "delay_s", "status"} dicts, a
    script a list of them or {"samples": [list, …]} (`Samples`)."""
    import os
    import subprocess
    import sys
    import tempfile

    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(scripts, handle)
    child = subprocess.Popen([sys.executable, "-m", "task_workers.policy.scripted", "--scripts", handle.name,
                              "--port", str(port), *(["--generate"] if generate else [])])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/health", alive=lambda: child.poll() is None, timeout_s=30, poll_s=0.1,
                     what="the scripted policy server process")
        yield f"{url}/v1"
    finally:
        child.terminate()
        child.wait(10)
        os.unlink(handle.name)


if __name__ == "__main__":
    main()
