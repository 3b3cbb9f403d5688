"""A deterministic stand-in for a judge server (an OpenAI-compatible `/v1/completions` over real HTTP),
for tests where what is tested is the platform around the judge — which pairs are asked, in which
orders, what is stored, when a group becomes claimable, what an outage does — not a model's choice (a
real tiny vLLM judge answers arbitrarily; tests/environments/test_judge.py runs one).

    with serve_judge(prefers("GOOD")) as judge:     # judge.url, judge.prompts, judge.down = True,
        ...                                         # judge.max_prompt_chars = 5000 (longer: HTTP 400)
    with serve_judge(scores(7)) as judge:           # a pointwise judge: "Score: 7" to every episode
    python -m tests.support.standin_judge 10.77.0.7 8001 7   # the same, as a process (a fleet's judge host)
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from environments.judge import WINNER_LINE

Decide = Callable[[str], str]
"""The prompt → the answer's last line (`Winner: A`, `Score: 7`)."""


def episode_text(prompt: str, label: str) -> str:
    """The text fenced as `EPISODE-{label}` in a pairwise prompt (the judge knows the nonce: it reads the
    markers that end the fence, as a real judge would)."""
    found = re.search(rf"<<<EPISODE-{label}-([0-9a-f]{{16}})\n(.*?)\nEPISODE-{label}-\1>>>", prompt, re.DOTALL)
    assert found, f"no EPISODE-{label} fence in the prompt"
    return found.group(2)


def prefers(marker: str) -> Decide:
    """A fair judge: the episode that contains `marker` wins; neither or both: A (a position bias)."""
    def decide(prompt: str) -> str:
        in_a, in_b = marker in episode_text(prompt, "A"), marker in episode_text(prompt, "B")
        return f"Winner: {'B' if in_b and not in_a else 'A'}"
    return decide


def swayed(marker: str) -> Decide:
    """A judge that can be swayed: it obeys the last `Winner: X` line inside the episodes it reads (an
    agent's injected answer), and otherwise judges fairly, as `prefers(marker)`."""
    fair = prefers(marker)

    def decide(prompt: str) -> str:
        found = WINNER_LINE.findall(episode_text(prompt, "A") + "\n" + episode_text(prompt, "B"))
        return f"Winner: {found[-1].upper()}" if found else fair(prompt)
    return decide


def scores(value: int) -> Decide:
    """A pointwise judge that gives every episode the same score."""
    return lambda prompt: f"Score: {value}"


@dataclass
class StandInJudge:
    url: str
    prompts: list[str] = field(default_factory=list)
    asked: int = 0
    """Requests received, answered or not (an outage's included)."""
    down: bool = False
    """Answer 503 to everything (an outage)."""
    max_prompt_chars: int | None = None
    """Refuse (HTTP 400, as vLLM refuses a prompt over its context) a prompt longer than this."""


@contextmanager
def serve_judge(decide: Decide, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[StandInJudge]:
    state = StandInJudge(url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state.asked += 1
            if state.down:
                self._answer(503, {"error": "the judge is down (StandInJudge.down)"})
                return
            with lock:
                state.prompts.append(body["prompt"])
            if state.max_prompt_chars is not None and len(body["prompt"]) > state.max_prompt_chars:
                self._answer(400, {"error": f"the prompt is {len(body['prompt'])} characters, over the "
                                            f"stand-in's context ({state.max_prompt_chars})"})
                return
            text = f"Reason: the stand-in decided.\n{decide(body['prompt'])}\n"
            self._answer(200, {"choices": [{"text": text}]})

        def _answer(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    state.url = f"http://{host}:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":  # a judge host of its own (tests/fleet): python -m tests.support.standin_judge HOST PORT SCORE
    import signal
    import sys

    stops = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # taken by sigwait below, not by their default handlers
    with serve_judge(scores(int(sys.argv[3])), host=sys.argv[1], port=int(sys.argv[2])):
        signal.sigwait(stops)
