"""A pool of policy servers (vLLM replicas) with episode affinity, as verl's AsyncLLMServerManager.

Each episode leases ONE replica for all its turns: turn k's prompt extends turn k-1's, so the replica
that served k-1 holds its prefix in the KV cache. A new episode takes the replica with the fewest
episodes leased, then the fewest requests in flight; ties go to the replica chosen least recently
(round robin), so the choice is deterministic for a given history.

A replica whose request fails after the client's retries (`ReplicaUnavailable`: no connection, 5xx,
429) is taken out of rotation for `cooldown_s`, then re-probed (GET /v1/models) before it serves
again. The episode moves to another replica and repeats the request there: prompts are token ids, so
the conversation moves losslessly; each turn records the replica that sampled it. Only when no
replica is healthy does the episode raise `PolicyError`, an infrastructure fault (retried as before).

A replica the trainer paused (trainer/sync.py quarantines one whose weights failed their probe: vLLM
queues its requests and samples nothing) still lists its model, so both the re-probe and the lease
ask `GET /is_paused` too: a new episode goes to an unpaused replica when there is one (a replica is
also paused for the moment of every weight load, so a paused replica is passed over, not taken out
of rotation; when all are paused the episode waits on one); the re-probe keeps a paused replica out
of rotation. The answer is cached for `pause_check_s` per replica.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from core.renderers import Renderer
from core.schemas.run import Sampling
from core.schemas.worker import ReplicaOut
from core.settings import public_url as replica_name
from task_workers.policy.client import Completion, PolicyClient, PolicyError, ReplicaUnavailable

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class ReplicaHealth:
    name: str
    healthy: bool
    leases: int
    """Episodes holding it now."""
    in_flight: int
    last_error: str | None


class _Replica:
    def __init__(self, url: str, client: PolicyClient) -> None:
        self.url = url
        self.name = replica_name(url)
        self.client = client
        self.healthy = True
        self.leases = 0
        self.in_flight = 0
        self.chosen_at = 0  # the pool's choice counter when last chosen (round robin among ties)
        self.retry_at = 0.0  # monotonic time after which a down replica is re-probed
        self.probing = False
        self.last_error: str | None = None
        self.paused = False
        self.paused_checked_at = -float("inf")  # monotonic time of the last GET /is_paused


class PolicyPool:
    """The replicas one worker process shares among its episode threads (thread-safe)."""

    def __init__(
        self, urls: list[str], *, cooldown_s: float = 30.0, probe_timeout_s: float = 3.0, pause_check_s: float = 2.0,
        client_factory: Callable[[str], PolicyClient] | None = None,
    ) -> None:
        if not urls:
            raise ValueError("a policy pool needs at least one replica URL")
        factory = client_factory or (lambda url: PolicyClient(base_url=url))
        self._replicas = [_Replica(url, factory(url)) for url in urls]
        self._cooldown_s = cooldown_s
        self._probe_timeout_s = probe_timeout_s
        self._pause_check_s = pause_check_s
        self._lock = threading.Lock()
        self._choices = 0

    @property
    def names(self) -> list[str]:
        return [replica.name for replica in self._replicas]

    def close(self) -> None:
        for replica in self._replicas:
            replica.client.close()

    @contextmanager
    def episode(self) -> Iterator[EpisodePolicy]:
        """A PolicyClient-like object for one episode: every turn on one replica while it is healthy."""
        policy = EpisodePolicy(self)
        try:
            yield policy
        finally:
            policy.release()

    def out_of_rotation(self) -> dict[str, ReplicaOut]:
        """The replicas this worker sends no new episode to, as its heartbeat publishes them (the API and
        `crucible doctor` show it): name → when it is re-probed (epoch seconds; earlier if every replica
        is down) and why it went out. A replica whose re-probe is due is asked first: what is published
        is never a cool-down already over (an idle worker would otherwise publish it until its next episode)."""
        self._revive(set(), force=False)
        offset = time.time() - time.monotonic()
        with self._lock:
            return {r.name: ReplicaOut(until=round(r.retry_at + offset, 3), error=r.last_error)
                    for r in self._replicas if not r.healthy}

    def health(self, *, probe: bool = False) -> list[ReplicaHealth]:
        """Each replica's state; `probe`: ask each one now (GET /v1/models) and record the answer."""
        if probe:
            for replica in self._replicas:
                error = self._probe(replica)
                with self._lock:
                    self._set_health(replica, error)
        with self._lock:
            return [ReplicaHealth(r.name, r.healthy, r.leases, r.in_flight, r.last_error) for r in self._replicas]

    # -- leasing -------------------------------------------------------------------------------------

    def _acquire(self, exclude: set[str]) -> _Replica:
        """The least loaded healthy replica not in `exclude` (names), leased; PolicyError when none is."""
        self._revive(exclude, force=False)
        chosen = self._choose(exclude)
        if chosen is None:  # every replica is down: ask each again now rather than fail on stale news
            self._revive(exclude, force=True)
            chosen = self._choose(exclude)
        if chosen is None:
            with self._lock:
                errors = "; ".join(f"{r.name}: {r.last_error}" for r in self._replicas if not r.healthy)
            raise PolicyError(f"no healthy policy replica among {len(self._replicas)} ({errors or 'all tried'})")
        return chosen

    def _choose(self, exclude: set[str]) -> _Replica | None:
        now = time.monotonic()
        with self._lock:
            stale = [r for r in self._replicas if r.healthy and r.name not in exclude
                     and r.paused_checked_at + self._pause_check_s <= now]
        for replica in stale:  # outside the lock: one short GET each, at most every pause_check_s
            paused = self._is_paused(replica)
            with self._lock:
                replica.paused, replica.paused_checked_at = paused, time.monotonic()
        with self._lock:
            candidates = [r for r in self._replicas if r.healthy and r.name not in exclude]
            if not candidates:
                return None
            chosen = min(candidates, key=lambda r: (r.paused, r.leases, r.in_flight, r.chosen_at))
            self._choices += 1
            chosen.chosen_at = self._choices
            chosen.leases += 1
            return chosen

    def _release(self, replica: _Replica) -> None:
        with self._lock:
            replica.leases -= 1

    @contextmanager
    def _request(self, replica: _Replica) -> Iterator[None]:
        with self._lock:
            replica.in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                replica.in_flight -= 1

    def _mark_down(self, replica: _Replica, error: Exception) -> None:
        with self._lock:
            if replica.healthy:
                logger.warning("policy replica %s out of rotation for %.0fs: %s", replica.name, self._cooldown_s, error)
            self._set_health(replica, str(error)[-300:])

    def _set_health(self, replica: _Replica, error: str | None) -> None:
        """Under the lock: record a probe's or a request's outcome (error None: it answered)."""
        replica.healthy = error is None
        replica.last_error = error
        if error is not None:
            replica.retry_at = time.monotonic() + self._cooldown_s

    def _revive(self, exclude: set[str], *, force: bool) -> None:
        """Probe the down replicas whose cool-down is over (`force`: all of them), outside the lock and at
        once: however many are unreachable, this takes as long as the slowest probe (the heartbeat calls it)."""
        now = time.monotonic()
        with self._lock:
            due = [r for r in self._replicas if not r.healthy and not r.probing and r.name not in exclude
                   and (force or r.retry_at <= now)]
            for replica in due:
                replica.probing = True
        if not due:
            return
        with ThreadPoolExecutor(max_workers=len(due), thread_name_prefix="crucible-probe") as probes:
            errors = list(probes.map(self._probe, due))
        for replica, error in zip(due, errors, strict=True):
            with self._lock:
                replica.probing = False
                self._set_health(replica, error)
            if error is None:
                logger.info("policy replica %s is back in rotation", replica.name)

    def _probe(self, replica: _Replica) -> str | None:
        """None if the replica lists its model and is not paused; else why not."""
        try:
            response = httpx.get(f"{_root(replica)}/v1/models", timeout=self._probe_timeout_s)
            response.raise_for_status()
            if not response.json().get("data"):
                return "GET /v1/models listed no model"
        except (httpx.HTTPError, ValueError, AttributeError) as error:
            return f"GET /v1/models: {error!r}"
        if self._is_paused(replica):
            return "paused (the trainer quarantines a replica whose weights failed their probe until it re-syncs it)"
        return None

    def _is_paused(self, replica: _Replica) -> bool:
        """GET /is_paused says so. A server without the route (404), or one that does not answer, is
        not called paused here: its requests fail on their own and take it out of rotation."""
        try:
            response = httpx.get(f"{_root(replica)}/is_paused", timeout=self._probe_timeout_s)
            return response.status_code == 200 and response.json().get("is_paused") is True
        except (httpx.HTTPError, ValueError, AttributeError):
            return False


def _root(replica: _Replica) -> str:
    return replica.url.removesuffix("/").removesuffix("/v1")


class EpisodePolicy:
    """PolicyClient's interface for one episode, over the replica it leased. On `ReplicaUnavailable`
    the replica is taken out of rotation and the call is repeated on another (the episode's turns
    so far are token ids, valid on any replica of the same weights)."""

    def __init__(self, pool: PolicyPool) -> None:
        self._pool = pool
        self._replica: _Replica | None = None
        self._lock = threading.Lock()

    @property
    def replica(self) -> str | None:
        """The replica the episode is on now (None before its first request)."""
        return self._replica.name if self._replica else None

    def release(self) -> None:
        with self._lock:
            if self._replica is not None:
                self._pool._release(self._replica)
                self._replica = None

    def _call(self, request: Callable[[PolicyClient], T]) -> tuple[T, str]:
        tried: set[str] = set()
        while True:
            with self._lock:
                if self._replica is None:
                    self._replica = self._pool._acquire(tried)
                replica = self._replica
            try:
                with self._pool._request(replica):
                    return request(replica.client), replica.name
            except ReplicaUnavailable as error:
                tried.add(replica.name)
                self._pool._mark_down(replica, error)
                logger.warning("episode moves off policy replica %s: %s", replica.name, error)
                self.release()

    @property
    def labels_every_token(self) -> bool:
        return self._replica.client.labels_every_token if self._replica else False

    def model(self) -> str:
        return self._call(lambda client: client.model())[0]

    def tokenize_chat(self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        return self._call(lambda client: client.tokenize_chat(messages=messages, tools=tools))[0]

    def tokenize(self, text: str) -> list[int]:
        return self._call(lambda client: client.tokenize(text))[0]

    def tokenize_plain(self, text: str) -> list[int]:
        return self._call(lambda client: client.tokenize_plain(text))[0]

    def end_of_turn_id(self) -> int:
        return self._call(lambda client: client.end_of_turn_id())[0]

    def end_of_turn_ids(self) -> tuple[int, ...]:
        return self._call(lambda client: client.end_of_turn_ids())[0]

    def renderer(self) -> Renderer:
        """The served chat template's family (every replica serves the same model)."""
        return self._call(lambda client: client.renderer())[0]

    def weight_version(self) -> str | None:
        return self._call(lambda client: client.weight_version())[0]

    def complete(
        self, *, prompt_ids: list[int], max_tokens: int, sampling: Sampling | None = None, seed: int | None = None,
    ) -> Completion:
        completion, name = self._call(lambda client: client.complete(
            prompt_ids=prompt_ids, max_tokens=max_tokens, sampling=sampling, seed=seed))
        return dataclasses.replace(completion, replica=name)
