"""The policy pool against real scripted policy servers (vLLM's wire format), two or three replicas:
episode affinity, least-outstanding spread, failover when a replica's process is killed, and settings
that name the pool. Replicas that must die run in their own process and are stopped for real."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from core.errors import ConfigError
from core.net import free_port
from core.settings import load_settings
from environments.parsing import hermes_call
from task_workers.policy.client import Completion, PolicyClient, PolicyError
from task_workers.policy.pool import EpisodePolicy, PolicyPool
from task_workers.policy.scripted import ScriptedPolicy, detokenize, serve

SCRIPT = [hermes_call("bash", command=f"echo {turn}") for turn in range(4)]
ROOT = Path(__file__).parents[3]


class Replica:
    """A scripted policy server in its own process, on a fixed port (so it can be killed and restarted)."""

    def __init__(self, scripts_file: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._scripts = scripts_file
        self._child: subprocess.Popen[bytes] | None = None

    def start(self) -> Replica:
        self._child = subprocess.Popen([sys.executable, "-m", "task_workers.policy.scripted", "--scripts",
                                        str(self._scripts), "--port", str(self.port)], cwd=ROOT)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self._child.poll() is not None:
                raise RuntimeError("the scripted policy server process did not start")
            time.sleep(0.1)

    def kill(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait(10)
            self._child = None


@pytest.fixture
def process_replicas(tmp_path: Path) -> Iterator[list[Replica]]:
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps({"walk": SCRIPT}))
    replicas = [Replica(scripts), Replica(scripts)]
    try:
        for replica in replicas:
            replica.start()
        yield replicas
    finally:
        for replica in replicas:
            replica.kill()


@pytest.fixture
def thread_replicas() -> Iterator[list[tuple[ScriptedPolicy, str]]]:
    """Three in-thread servers: each counts the completions it served."""
    with ExitStack() as stack:
        servers = [ScriptedPolicy({"walk": list(SCRIPT)}) for _ in range(3)]
        yield [(server, stack.enter_context(serve(server))) for server in servers]


def _pool(urls: list[str], **options: float) -> PolicyPool:
    return PolicyPool(urls, client_factory=lambda url: PolicyClient(base_url=url, retries=1, backoff_s=0.01),
                      **options)


def _prompt(policy: EpisodePolicy) -> list[int]:
    return policy.tokenize_chat(messages=[{"role": "system", "content": "sys"},
                                          {"role": "user", "content": "go [script:walk]"}], tools=None)


def _turn(policy: EpisodePolicy, tokens: list[int]) -> Completion:
    """One turn: the completion, then the tool's reply as plain tokens; `tokens` grows in place."""
    completion = policy.complete(prompt_ids=list(tokens), max_tokens=256)
    tokens += completion.token_ids + policy.tokenize("\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")
    return completion


def test_every_turn_of_an_episode_goes_to_one_replica(thread_replicas) -> None:
    pool = _pool([url for _, url in thread_replicas])
    with pool.episode() as policy:
        tokens = _prompt(policy)
        completions = [_turn(policy, tokens) for _ in range(4)]
    names = {completion.replica for completion in completions}
    assert len(names) == 1 and names <= set(pool.names)
    assert [completion.text.removesuffix("<|im_end|>") for completion in completions] == SCRIPT
    served = [server.requests for server, _ in thread_replicas]
    assert sorted(served) == [0, 0, 4], served
    assert pool.names[served.index(4)] == completions[0].replica
    assert [h.leases for h in pool.health()] == [0, 0, 0]  # released when the episode ended
    pool.close()


def test_concurrent_episodes_spread_by_least_outstanding(thread_replicas) -> None:
    pool = _pool([url for _, url in thread_replicas])
    holding = threading.Barrier(6)
    replicas: list[set[str | None]] = []
    errors: list[BaseException] = []

    def episode() -> None:
        try:
            with pool.episode() as policy:
                tokens = _prompt(policy)
                holding.wait(30)  # every episode holds its replica: each choice saw all the others
                replicas.append({_turn(policy, tokens).replica for _ in range(2)})
        except BaseException as error:  # reported by the test thread
            errors.append(error)

    threads = [threading.Thread(target=episode) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert all(len(names) == 1 for names in replicas)
    counts = {name: sum(names == {name} for names in replicas) for name in pool.names}
    assert counts == dict.fromkeys(pool.names, 2)
    assert [server.requests for server, _ in thread_replicas] == [4, 4, 4]
    pool.close()


def test_ties_rotate_and_a_released_replica_is_chosen_again(thread_replicas) -> None:
    pool = _pool([url for _, url in thread_replicas])
    with ExitStack() as stack:
        episodes = [stack.enter_context(pool.episode()) for _ in range(3)]
        for policy in episodes:
            policy.model()
        assert [policy.replica for policy in episodes] == pool.names  # round robin over the ties
        episodes[1].release()
        late = stack.enter_context(pool.episode())
        late.model()
        assert late.replica == pool.names[1]  # the only one with no episode now
    pool.close()


def test_a_paused_replica_gets_no_new_episode_and_a_probe_keeps_it_out(thread_replicas) -> None:
    """The trainer pauses a replica whose weights failed their probe (trainer/sync.py); vLLM then queues its
    requests, yet still lists its model. New episodes go elsewhere; the re-probe keeps it out until resumed."""
    servers = [server for server, _ in thread_replicas]
    pool = _pool([url for _, url in thread_replicas], pause_check_s=0.0)
    servers[0].paused = True
    with ExitStack() as stack:
        episodes = [stack.enter_context(pool.episode()) for _ in range(4)]
        for policy in episodes:
            policy.model()
        chosen = [policy.replica for policy in episodes]
    assert pool.names[0] not in chosen and set(chosen) == set(pool.names[1:]), chosen
    health = {h.name: h for h in pool.health(probe=True)}
    assert not health[pool.names[0]].healthy and "paused" in str(health[pool.names[0]].last_error)
    # Every replica paused (each is, for the moment of a weight load): an episode still gets one and waits.
    for server in servers:
        server.paused = True
    with pool.episode() as policy:
        policy.model()
        assert policy.replica in pool.names[1:]
    for server in servers:
        server.paused = False
    assert all(h.healthy for h in pool.health(probe=True))
    pool.close()


def test_what_an_idle_worker_publishes_is_asked_again_once_the_cool_down_is_over(thread_replicas) -> None:
    """(issue 50) A restarted replica stayed "out of rotation until T" on `crucible doctor` long after T while
    no episode needed it: the heartbeat published the pool's last news. Publishing re-probes what is due."""
    server, url = thread_replicas[0]
    held = _pool([url], cooldown_s=3600.0)
    server.paused = True
    assert list(held.out_of_rotation()) == [] and not held.health(probe=True)[0].healthy
    server.paused = False
    assert list(held.out_of_rotation()) == [url]  # its cool-down is not over: not asked again yet
    held.close()
    due = _pool([url], cooldown_s=0.0)  # every cool-down over at once
    server.paused = True
    due.health(probe=True)
    assert list(due.out_of_rotation()) == [url]  # asked again: still paused, still out
    server.paused = False
    assert due.out_of_rotation() == {} and due.health()[0].healthy  # asked again: back, and shown back
    due.close()


def test_a_replica_killed_mid_episode_hands_the_episode_to_the_other(process_replicas) -> None:
    pool = _pool([replica.url for replica in process_replicas], cooldown_s=0.0)
    by_name = dict(zip(pool.names, process_replicas, strict=True))
    with pool.episode() as policy:
        tokens = _prompt(policy)
        first = [_turn(policy, tokens) for _ in range(2)]
        by_name[first[0].replica].kill()  # its process is gone: connections are refused
        later = [_turn(policy, tokens) for _ in range(2)]
    assert first[0].replica == first[1].replica
    other = next(name for name in pool.names if name != first[0].replica)
    assert [completion.replica for completion in later] == [other, other]
    # Nothing lost: the other replica saw the whole conversation (the script picks its reply by the
    # number of assistant turns in the prompt) and answered turns 3 and 4.
    assert [c.text.removesuffix("<|im_end|>") for c in first + later] == SCRIPT
    assert "echo 1" in detokenize(tokens)
    health = {h.name: h for h in pool.health()}
    assert not health[first[0].replica].healthy and health[first[0].replica].last_error
    assert health[other].healthy
    # Restarted on its port, it is probed and back in rotation (cool-down 0): the next episode takes it.
    by_name[first[0].replica].start()
    with pool.episode() as policy:
        assert policy.complete(prompt_ids=_prompt(policy), max_tokens=64).replica in pool.names
    assert all(h.healthy for h in pool.health())
    pool.close()


def test_all_replicas_down_is_a_policy_error(process_replicas) -> None:
    refused = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    pool = _pool([process_replicas[0].url, refused])
    with pool.episode() as policy:
        tokens = _prompt(policy)
        assert _turn(policy, tokens).replica == pool.names[0]
        process_replicas[0].kill()
        with pytest.raises(PolicyError, match=r"no healthy policy replica among 2 \(.*ConnectError"):
            _turn(policy, tokens)
    assert not any(h.healthy for h in pool.health(probe=True))
    pool.close()


def test_a_request_error_is_not_a_replica_fault(thread_replicas) -> None:
    """A 4xx (the request's fault: here a prompt over the context) moves nothing and downs no replica."""
    pool = _pool([url for _, url in thread_replicas])
    with pool.episode() as policy:
        with pytest.raises(PolicyError, match="maximum context length"):
            policy.complete(prompt_ids=[65] * 20000, max_tokens=16)
        first = policy.replica
        assert policy.complete(prompt_ids=_prompt(policy), max_tokens=64).replica == first
    assert all(h.healthy for h in pool.health())
    pool.close()


def test_the_pool_setting_names_the_replicas_and_the_first_is_the_policy_url(monkeypatch) -> None:
    monkeypatch.setenv("CRUCIBLE_POLICY_URLS", " http://a:8000/v1 , https://b.example/v1/ ")
    monkeypatch.delenv("CRUCIBLE_POLICY_URL", raising=False)
    settings = load_settings()
    assert settings.policy_pool == ["http://a:8000/v1", "https://b.example/v1"]
    assert settings.policy_url == "http://a:8000/v1"
    monkeypatch.delenv("CRUCIBLE_POLICY_URLS")
    assert load_settings(policy_url="http://c:1/v1").policy_pool == ["http://c:1/v1"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "expected one or more comma-separated http:// or https:// URLs, got ''"),
        (" , ,", "expected one or more comma-separated http:// or https:// URLs"),
        ("localhost:8000", "expected http:// or https:// URLs of at most 2048 characters, not 'localhost:8000'"),
        ("http://a:8000,ftp://b", "not 'ftp://b'"),
        ("http://a:99999", "not 'http://a:99999'"),
        ("http://", "not 'http://'"),
        ("http://a\x07b:1", "not 'http://a\\x07b:1'"),
        ("http://a:8000,http://A:8000/v1/", "expected each server once, 'http://A:8000/v1' repeats 'http://a:8000'"),
        (",".join(f"http://h{i}:8000" for i in range(10_000)), "expected at most 256 URLs (10000 given)"),
        ("http://" + "a" * 1_000_000, "expected at most 256 URLs of 2048 characters, comma-separated"),
        ("http://" + "a" * 5000, "expected http:// or https:// URLs of at most 2048 characters"),
    ],
)
def test_hostile_pool_settings_are_one_short_line(monkeypatch, value: str, expected: str) -> None:
    monkeypatch.setenv("CRUCIBLE_POLICY_URLS", value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("CRUCIBLE_POLICY_URLS: ") and expected in message, message
    assert "\n" not in message and len(message) < 600


def test_a_pool_needs_a_replica() -> None:
    with pytest.raises(ValueError, match="at least one replica"):
        PolicyPool([])


def test_doctor_checks_each_replica_and_shows_no_credentials(thread_replicas) -> None:
    from core.health import check_policy_pool

    port = free_port()  # nothing listens there
    live = thread_replicas[0][1]
    settings = load_settings(policy_urls=f"{live},http://user:secret@127.0.0.1:{port}/v1")
    live_check, dead_check = check_policy_pool(settings)
    assert (live_check.name, live_check.ok, live_check.detail) == ("policy replica 1", True,
                                                                   f"{live} serving scripted, weights 0")
    assert dead_check.name == "policy replica 2" and not dead_check.ok and not dead_check.required
    assert dead_check.detail.startswith(f"http://127.0.0.1:{port}/v1: ConnectError")
    assert "secret" not in dead_check.detail + dead_check.fix and "CRUCIBLE_POLICY_URLS" in dead_check.fix
    assert [check.name for check in check_policy_pool(load_settings(policy_url=live))] == ["policy server"]
    thread_replicas[0][0].paused = True  # as the trainer leaves a replica whose weights failed their probe
    paused = check_policy_pool(settings)[0]
    assert not paused.ok and paused.detail.endswith("PAUSED") and "sync_error" in paused.fix

