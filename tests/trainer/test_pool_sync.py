"""Weight sync to every replica of a policy pool (issue 14, deliverable 2).

- hostile inputs: a publisher with no replica or one twice, model directories that do not match the
  pool (too few, shared, not on this host), a pool where no replica answers;
- end to end (slow): two real vLLM replicas (CPU) and the real trainer — every step reaches both and
  publishes its version once; a replica whose probe fails is rolled back and paused while the other
  serves the new version (no mixed weights), then re-synced once it is fixed; a restarted replica is
  re-synced before training goes on.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import torch
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from transformers import PreTrainedTokenizerBase

from cli.trainer import replica_dirs
from core.errors import ConfigError
from core.models import PolicyVersion, Run
from core.net import free_port
from core.versions import Label
from tests.factories import add_group, make_environment, make_run
from trainer.errors import WeightSyncError
from trainer.loop import Trainer
from trainer.probe import probe_token_ids, verify_sync
from trainer.serving import VllmServer, group_members
from trainer.sync import PolicyServer, Publisher, Replica
from trainer.weight_sync import ReloadWeightSyncer

AGREE = 1e-4  # float32 on both sides agree to ~1e-6 per probe token


def _server(url: str, model_dir: Path) -> PolicyServer:
    return PolicyServer(api_url=f"{url}/v1", base_url=url, model_name="tiny", model_dir=model_dir)


def _replica(url: str, model_dir: Path) -> Replica:
    return Replica(server=_server(url, model_dir), syncer=ReloadWeightSyncer(base_url=url, model_dir=model_dir))


# ---- hostile inputs (no vLLM) ---------------------------------------------------------------------

def test_a_publisher_refuses_no_replica_a_replica_twice_and_two_ways_of_naming_them(tiny_model_dir: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match="expected one or more policy replicas, got none"):
        Publisher(replicas=[], probe_ids=[1, 2])
    with pytest.raises(ConfigError, match="expected each policy replica once"):
        Publisher(replicas=[_replica(url, tiny_model_dir), _replica(url, tiny_model_dir)], probe_ids=[1, 2])
    port = free_port()
    with pytest.raises(ConfigError, match="expected each policy replica once"):  # one server, two spellings
        Publisher(replicas=[_replica(f"http://localhost:{port}", tiny_model_dir),
                            _replica(f"http://LocalHost:{port}", tiny_model_dir)], probe_ids=[1, 2])
    with pytest.raises(ConfigError, match="got both"):
        Publisher(server=_server(url, tiny_model_dir), replicas=[_replica(url, tiny_model_dir)], probe_ids=[1, 2])
    with pytest.raises(ConfigError, match="got server= alone"):
        Publisher(server=_server(url, tiny_model_dir), probe_ids=[1, 2])
    with pytest.raises(ConfigError, match="got neither"):
        Publisher(probe_ids=[1, 2])


def test_when_no_replica_answers_the_resync_fails_naming_each_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two replicas on ports nothing listens on: a re-sync cannot find one serving any version."""
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    dirs = [Path(shutil.copytree(tiny_model_dir, tmp_path / f"r{i}")) for i in range(2)]
    publisher = Publisher(replicas=[_replica(u, d) for u, d in zip(urls, dirs, strict=True)], probe_ids=[1, 2],
                          silence_grace_s=0.5)
    try:
        # The first silence is forgiven (a busy server can miss one check); silence past the grace is not.
        assert publisher.resync(engine=cast(Any, None), version=3) is None
        time.sleep(0.6)
        with pytest.raises(WeightSyncError, match="no policy replica answers") as caught:
            publisher.resync(engine=cast(Any, None), version=3)  # the engine is never reached: nothing to sync
        assert all(f"{url}/v1" in str(caught.value) for url in urls)
        versions = publisher.served_versions()
        assert all(isinstance(tag, WeightSyncError) for tag in versions.values())
    finally:
        publisher.close()


def test_each_replica_needs_its_own_model_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    urls = ["http://a:8000/v1", "http://b:8000/v1"]
    other = Path(shutil.copytree(tiny_model_dir, tmp_path / "other"))
    assert replica_dirs(urls=urls, given=[tiny_model_dir, other], fallback=None, roots=[None, None]) == [
        tiny_model_dir, other]
    with pytest.raises(ConfigError, match=r"one served model directory per policy replica \(2.*got 1"):
        replica_dirs(urls=urls, given=[tiny_model_dir], fallback=None, roots=[None, None])
    with pytest.raises(ConfigError, match="weight sync rewrites it"):  # the same directory, spelled two ways
        replica_dirs(urls=urls, given=[tiny_model_dir, tiny_model_dir / ".." / tiny_model_dir.name],
                     fallback=None, roots=[None, None])
    with pytest.raises(ConfigError, match="weight sync rewrites it"):  # servers on one directory
        replica_dirs(urls=urls, given=[], fallback=None, roots=[str(tiny_model_dir)] * 2)
    # Without --policy-dir: what each server reports, if it is a model directory here (never the fallback,
    # which names one directory for a whole pool).
    assert replica_dirs(urls=urls, given=[], fallback=tiny_model_dir, roots=[str(tiny_model_dir), str(other)]) == [
        tiny_model_dir, other]
    for hostile in (None, "", "Qwen/Qwen3-8B", str(tmp_path), "/nonexistent\x00", "x" * 5000):
        with pytest.raises(ConfigError, match="expected the served model directory of http://b:8000/v1"):
            replica_dirs(urls=urls, given=[], fallback=None, roots=[str(tiny_model_dir), hostile])
    # One server: CRUCIBLE_POLICY_TOKENIZER as before, else the directory it reports.
    assert replica_dirs(urls=urls[:1], given=[], fallback=other, roots=[None]) == [other]
    assert replica_dirs(urls=urls[:1], given=[], fallback=None, roots=[str(other)]) == [other]


# ---- two real replicas ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def replicas(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    """Two real vLLM servers (float32, eager), each on its own copy of the tiny model (weight sync
    rewrites a replica's directory); always stopped."""
    servers: list[VllmServer] = []
    with contextlib.ExitStack() as stack:
        for index in range(2):
            served = Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp(f"replica{index}") / "model"))
            server = VllmServer(model_dir=served, served_model_name="tiny", max_model_len=1024,
                                log_path=served.parent / "server.log", startup_timeout_s=600)
            stack.enter_context(server)
            servers.append(server)
        yield servers
    assert all(s.pid is not None and group_members(s.pid) == [] for s in servers), "vLLM outlived stop()"


class CorruptingSyncer(ReloadWeightSyncer):
    """FAILURE INJECTION ONLY: the real reload path, real files and a real vLLM, but the weights it
    loads are perturbed (noise on lm_head: a constant shift would leave every softmax unchanged), as a
    push that went wrong on one host would leave them. The real probe must catch it."""

    def load(self, *, model: torch.nn.Module, label: Label) -> float:
        state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        noise = torch.randn(state["lm_head.weight"].shape, generator=torch.Generator().manual_seed(0))
        state["lm_head.weight"] += 0.5 * noise
        from trainer.sync import ExportedWeights

        return super().load(model=ExportedWeights(state, getattr(model, "config", None)), label=label)


def _tag(server: VllmServer) -> str:
    """The version a server's label names, committed, as text; else the label itself ("default", provisional)."""
    text = str(httpx.get(f"{server.base_url}/weight_info").json()["weight_version"])
    label = Label.parse(text)
    return str(label.version) if label is not None and label.run is not None and not label.provisional else text


def _paused(server: VllmServer) -> bool:
    return bool(httpx.get(f"{server.base_url}/is_paused").json()["is_paused"])


def _serves(server: VllmServer, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
    verify_sync(model=model, api_url=server.api_url, model_name=server.model_name,
                token_ids=probe_token_ids(tokenizer), tolerance=AGREE)


def _published(session: Session, run_id: int) -> list[int]:
    session.expire_all()
    query = select(PolicyVersion.version).where(PolicyVersion.run_id == run_id).order_by(PolicyVersion.version)
    return list(session.execute(query).scalars())


@pytest.mark.slow  # two real vLLM servers on 2 shared cores: ~3-6 min; `make test-all` runs it
def test_every_replica_is_synced_a_failing_one_is_paused_and_a_late_one_is_synced_before_it_serves(
    db_session: Session, replicas: list[VllmServer], tokenizer: PreTrainedTokenizerBase, tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    a, b = replicas
    run = make_run(db_session, model=str(tiny_model_dir), group_size=2, batch_size=1, max_staleness=4,
                   trainer={"optimizer": {"lr": 1e-2}})
    env, task = make_environment(db_session)
    for seed in range(2):
        add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], seed=seed, vocab=len(tokenizer))
    db_session.commit()
    publisher = Publisher(replicas=[_replica(s.base_url, s.model_dir) for s in replicas],
                          probe_ids=probe_token_ids(tokenizer))
    trainer = Trainer(run_id=run.id, publisher=publisher, checkpoint_root=tmp_path / "ck")
    try:
        trainer.resume()  # the starting weights, version 0, on both
        assert [_tag(a), _tag(b)] == ["0", "0"]

        # Step 1 reaches both replicas; version 1 is published once.
        assert trainer.train_one_step() is not None
        assert [_tag(a), _tag(b)] == ["1", "1"] and _published(db_session, run.id) == [1]
        for server in replicas:
            _serves(server, trainer.engine.module, tokenizer)
        step1 = {name: tensor.clone() for name, tensor in trainer.engine.module.state_dict().items()}

        # Step 2: B's load goes wrong. B is rolled back to version 1 and paused BEFORE A is tagged 2:
        # the pool serves version 2 on A and nothing on B, never 1 beside 2.
        publisher.retry_s = 3600.0  # no retry of a paused replica until the test says so
        publisher.replicas[1].syncer.close()
        publisher.replicas[1] = Replica(server=publisher.replicas[1].server,
                                        syncer=CorruptingSyncer(base_url=b.base_url, model_dir=b.model_dir))
        assert trainer.train_one_step() is not None
        assert _tag(a) == "2" and not _paused(a)
        _serves(a, trainer.engine.module, tokenizer)
        assert _tag(b) == "1" and _paused(b)
        assert (b.model_dir / "model.safetensors").exists() and not (b.model_dir / ".previous-weights").exists()
        from safetensors.torch import load_file

        on_disk = load_file(b.model_dir / "model.safetensors")  # what B would serve if resumed: step 1's weights
        for name, tensor in step1.items():
            torch.testing.assert_close(on_disk[name], tensor)
        assert _published(db_session, run.id) == [1, 2]
        db_session.expire_all()
        stored = db_session.get(Run, run.id)
        assert stored is not None and stored.policy_version == 2
        assert stored.sync_error is not None and f"paused: {b.api_url}" in stored.sync_error
        assert "vLLM disagrees with the trainer's weights" in stored.sync_error

        # Not yet due for a retry (cool-down not over, tag unchanged): the loop leaves B paused.
        assert trainer.resync_if_needed() is False and _paused(b)
        # B is fixed and due: the loop re-syncs it to version 2, probed, resumed; nothing new is published.
        publisher.replicas[1].syncer.close()
        publisher.replicas[1] = _replica(b.base_url, b.model_dir)
        publisher.retry_s = 0.0
        assert trainer.resync_if_needed() is True
        assert [_tag(a), _tag(b)] == ["2", "2"] and not _paused(b)
        _serves(b, trainer.engine.module, tokenizer)
        assert trainer.resync_if_needed() is False
        assert _published(db_session, run.id) == [1, 2]

        # A restarted replica says "default" (simulated by its tag) and is re-synced before training goes on.
        httpx.post(f"{a.base_url}/update_weight_version", json={"new_version": "default"}).raise_for_status()
        assert trainer.resync_if_needed() is True
        assert [_tag(a), _tag(b)] == ["2", "2"]
        _serves(a, trainer.engine.module, tokenizer)
        assert _published(db_session, run.id) == [1, 2]
    finally:
        trainer.close()


@pytest.mark.slow  # two real vLLM servers on 2 shared cores (shares the module's replicas)
def test_when_every_replica_fails_its_probe_all_roll_back_unpaused_and_nothing_is_published(
    db_session: Session, replicas: list[VllmServer], tokenizer: PreTrainedTokenizerBase, tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    run = make_run(db_session, model=str(tiny_model_dir), group_size=2, batch_size=1, max_staleness=4,
                   trainer={"optimizer": {"lr": 1e-2}})
    env, task = make_environment(db_session)
    add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], vocab=len(tokenizer))
    db_session.commit()
    publisher = Publisher(replicas=[_replica(s.base_url, s.model_dir) for s in replicas],
                          probe_ids=probe_token_ids(tokenizer))
    trainer = Trainer(run_id=run.id, publisher=publisher, checkpoint_root=tmp_path / "ck")
    try:
        trainer.resume()
        start = {name: tensor.clone() for name, tensor in trainer.engine.module.state_dict().items()}
        publisher.tolerance = 1e-12  # no float32 pair agrees this closely: every probe fails
        with pytest.raises(WeightSyncError, match="version 1 not published, the previous weights serve again") as caught:
            trainer.train_one_step()
        assert all(s.api_url in str(caught.value) for s in replicas)
        for server in replicas:
            assert _tag(server) == "0" and not _paused(server)
        model = trainer.engine.module
        model.load_state_dict(start)
        for server in replicas:
            _serves(server, model, tokenizer)
        assert _published(db_session, run.id) == []
        db_session.expire_all()
        stored = db_session.get(Run, run.id)
        assert stored is not None and stored.sync_error is not None and "version 1 not published" in stored.sync_error
    finally:
        trainer.close()


# ---- two training runs, two real trainer processes (issue 47, item 2) ------------------------------

def _label_of(server: VllmServer) -> Label | None:
    return Label.parse(httpx.get(f"{server.base_url}/weight_info", timeout=120).json()["weight_version"])


def _start_trainer(run: Run, server: VllmServer, root: Path, *extra: str) -> Any:
    """`python -m cli.trainer --run R` on the run's own pool (no --policy-url: the run names it)."""
    import os
    import subprocess
    import sys

    log = (root / f"trainer-{run.id}.log").open("wb")
    command = [sys.executable, "-m", "cli.trainer", "--run", str(run.id), "--policy-dir", str(server.model_dir),
               "--checkpoint-dir", str(root / f"ck-{run.id}"), "--poll", "0.2", *extra]
    return subprocess.Popen(command, env={**os.environ, "CRUCIBLE_LOG_LEVEL": "INFO"}, stdout=log,
                            stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])


def _serving(server: VllmServer, run: Run, trainer: Any, root: Path, *, before: Label | None) -> None:
    """Wait until the run's trainer has pushed its version 0 to `server`: a load of its own (not the label
    `before` it started, which an earlier test's run of the same id may have left) by a live trainer."""
    deadline = time.monotonic() + 300
    while (label := _label_of(server)) is None or label == before or (
            label.run, label.version, label.provisional) != (run.id, 0, False):
        log = (root / f"trainer-{run.id}.log").read_text(errors="replace")[-3000:]
        assert trainer.poll() is None and time.monotonic() < deadline, log
        time.sleep(0.5)


@pytest.mark.slow  # two real vLLM servers and two trainer processes (shares the module's replicas)
def test_two_training_runs_on_one_pool(
    db_session: Session, replicas: list[VllmServer], tiny_model_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run A's trainer (a real process) holds replica P1. A second training run on P1 is refused at
    launch (the CLI prints one line); a run naming P2, its own, is launched. Its trainer pointed at P1
    under another spelling of its address (`--policy-url http://localhost:…`) refuses to push over A's
    weights; pointed at its own P2 it labels P2 with its run. Its episode samples from P2 only and
    stores its own version; an episode that reached another run's weights (A's on P1) is refused,
    nothing stored."""
    import json
    import os
    import signal

    import yaml
    from typer.testing import CliRunner

    from cli.main import app
    from core.models import Episode, EpisodeGroup, Task, Turn
    from core.store import insert_episode
    from environments.images import build_images
    from environments.sandboxes import DockerSandboxes
    from environments.service import register_environment
    from environments.spec import parse_spec
    from sandboxes import InMemoryEventSink, make_backend
    from task_workers.episode.errors import PolicyFault
    from task_workers.episode.runner import run_episode
    from task_workers.policy.client import PolicyClient
    from task_workers.policy.pool import PolicyPool

    p1, p2 = replicas
    from core.settings import get_settings

    monkeypatch.setenv("CRUCIBLE_POLICY_SERVERS", f"{p1.api_url},{p2.api_url}")  # servers runs may name
    get_settings.cache_clear()
    spec = {"name": "pools-e2e", "kind": "read_number", "image": "code-repo",
            "sandbox": {"memory": "256m", "pids": 128, "workspace_size": "16m", "tmp_size": "16m"},
            "limits": {"max_turns": 2, "max_context_tokens": 900, "max_response_tokens": 24, "tool_timeout_s": 5},
            "verifier": {"weights": {"answer": 1.0}}}
    build_images(names=["code-repo"], data_dir=Path(os.environ.get("CRUCIBLE_TEST_IMAGE_CACHE",
                                                                   Path.home() / ".cache" / "crucible")))
    env, _ = register_environment(db_session, spec=parse_spec(spec))
    task = Task(environment_name=env.name, external_id="pools-e2e", instruction="Read number.txt and submit it.",
                payload={"path": "number.txt", "number": "4821"}, split="train")
    db_session.add(task)
    first = make_run(db_session, model=str(tiny_model_dir), group_size=1, batch_size=1, policy_urls=[p1.api_url])
    db_session.commit()
    for server in replicas:  # as fresh servers: the module's earlier tests left labels of their own run ids
        httpx.post(f"{server.base_url}/update_weight_version", json={"new_version": "default"}).raise_for_status()
    before = _label_of(p1)
    trainers = [_start_trainer(first, p1, tmp_path)]
    try:
        _serving(p1, first, trainers[0], tmp_path, before=before)
        held = _label_of(p1)

        def launch(name: str, urls: list[str]) -> Any:
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump({"name": name, "model": str(tiny_model_dir), "group_size": 1,
                                            "environments": [{"name": env.name}], "policy_urls": urls}))
            return CliRunner().invoke(app, ["run", "launch", str(path), "-o", "json"])

        refused = launch("second-on-p1", [p1.api_url])
        assert refused.exit_code != 0 and f"held by the live trainer of run {first.id}" in refused.output
        assert len(refused.output.strip().splitlines()) == 1, refused.output
        own = launch("own-p2", [p2.api_url])
        assert own.exit_code == 0, own.output
        second = db_session.get(Run, int(json.loads(own.output[own.output.index("{"):])["id"]))
        assert second is not None
        alias = _start_trainer(second, p1, tmp_path, "--policy-url", p1.api_url.replace("127.0.0.1", "localhost"))
        assert alias.wait(timeout=300) != 0
        refusal = (tmp_path / f"trainer-{second.id}.log").read_text(errors="replace")
        assert f"serve the weights of run {first.id}, whose trainer is alive" in refusal, refusal[-3000:]
        assert _label_of(p1) == held  # nothing was pushed over A's weights
        before = _label_of(p2)
        trainers.append(_start_trainer(second, p2, tmp_path))
        _serving(p2, second, trainers[1], tmp_path, before=before)
        assert (_label_of(p1).run, _label_of(p2).run) == (first.id, second.id)  # type: ignore[union-attr]

        def episode(run: Run) -> int:
            index = db_session.execute(select(func.count()).where(EpisodeGroup.run_id == run.id)).scalar_one()
            group = EpisodeGroup(run_id=run.id, group_index=index, task_id=task.id, environment_id=env.id, size=1,
                                 policy_version=0)
            db_session.add(group)
            db_session.flush()
            episode_id, _ = insert_episode(db_session, run_id=run.id, group_id=group.id, sample_index=0,
                                           task_id=task.id, environment_id=env.id)
            db_session.commit()
            return episode_id

        def client(url: str) -> PolicyClient:
            return PolicyClient(base_url=url)

        platform = PolicyPool([p1.api_url], client_factory=client)  # the worker's default pool: P1
        pools: dict[str, PolicyPool] = {}

        def pool(urls: list[str]) -> PolicyPool:
            return pools.setdefault(",".join(urls), PolicyPool(urls, client_factory=client))

        with contextlib.ExitStack() as stack:
            sandboxes = DockerSandboxes(backend=make_backend("docker"), events=InMemoryEventSink(), worker="pools",
                                        min_size=0, max_size=1)
            stack.callback(sandboxes.close)
            stack.callback(platform.close)
            stack.callback(lambda: list(map(PolicyPool.close, pools.values())))
            mine = episode(second)
            assert run_episode(mine, policy=platform, sandboxes=sandboxes, worker="pools", pools=pool).stored
            db_session.expire_all()
            turns = list(db_session.execute(select(Turn).where(Turn.episode_id == mine)).scalars())
            assert turns and all((t.weight_version, t.weight_version_end) == (0, 0) for t in turns)
            assert set(pools) == {p2.api_url}  # it sampled from its own servers only
            # A worker that reached the other run's weights (its pool mapped to P1, where A's trainer
            # pushes): refused as an infrastructure fault, nothing stored.
            theirs = episode(second)
            with pytest.raises(PolicyFault, match=rf"run {first.id}'s weights sampled a turn of run {second.id}"):
                run_episode(theirs, policy=platform, sandboxes=sandboxes, worker="pools",
                            pools=lambda urls: platform)
            assert db_session.execute(select(Turn).where(Turn.episode_id == theirs)).first() is None
            assert db_session.get(Episode, theirs) is not None
    finally:
        for process in trainers:
            process.send_signal(signal.SIGTERM)
        for process in trainers:
            try:
                process.wait(timeout=60)
            except Exception:
                process.kill()
                process.wait()
        get_settings.cache_clear()
