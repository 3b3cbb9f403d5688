"""Multi-rank training (issue 14): a 2-rank DeepSpeed ZeRO step over gloo on CPU, stage 3 and stage 2 (the
default), gives the loss and (within 1e-5) the updated weights of the 1-rank step on the same batch. Each side runs in its own
processes (a real process group over loopback), both from the same tiny model and the same samples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from core.net import free_port
from trainer.advantages import assign_advantages
from trainer.ranks import Ranks, leave, share
from trainer.rollouts import Group, Sample

LR = 1e-3  # large enough that a wrong gradient moves weights well past the 1e-5 tolerance (measured: 4e-7 apart)


def _samples(count: int = 5) -> list[Sample]:
    samples = []
    for i in range(count):
        mask = [0] * (4 + i) + [1] * (26 + 8 * i)  # 30 to 66 tokens: about one a micro-batch of 64
        samples.append(Sample(
            episode_id=i, group_id=i // 3, environment="a", status="completed", termination="submitted",
            reward=float(i % 2), components={}, policy_version=0,
            token_ids=[(13 * t + 7 * i) % 300 + 3 for t in range(len(mask))], loss_mask=mask,
            behaviour_logprobs=[-6.0 - 0.1 * (t % 5) if m else 0.0 for t, m in enumerate(mask)], score=float(i % 2)))
    groups = [Group(id=g, group_index=g, environment="a", policy_version=0,
                    samples=[s for s in samples if s.group_id == g]) for g in (0, 1)]
    assign_advantages(groups, scale_by_std=True)
    return samples


# (stage, optimizer) of each comparison: every one runs in the same two launches (one rank, two ranks),
# one engine after another, since a launch costs each process a torch and DeepSpeed import.
CONFIGS = {
    "zero3-one-pass": (3, {"micro_batch_tokens": 64}),  # 5 micro-batches, 3 on rank 0 and 2 (+1 padding) on rank 1
    "zero3-two-epochs-two-minibatches": (3, {"micro_batch_tokens": 64, "epochs": 2, "minibatches": 2}),  # π_prox
    # recomputed, 4 optimizer steps
    "zero2-two-epochs-two-minibatches": (2, {"micro_batch_tokens": 64, "epochs": 2, "minibatches": 2}),  # the
    # default stage: sharded optimizer state
}


def _rank_main(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from trainer.config import TrainerConfig
    from trainer.engine import make_engine
    from trainer.step import update

    saved = {}
    for name, (stage, optimizer) in CONFIGS.items():  # each from the same fresh model
        config = TrainerConfig.model_validate({"optimizer": {"lr": LR, **optimizer}, "deepspeed": {"stage": stage}})
        engine = make_engine(model=AutoModelForCausalLM.from_pretrained(model_dir), config=config)
        assert (Ranks.current() is None) == (world == 1)
        results = [update(engine, _samples(), config=config) for _ in range(2)]
        weights = engine.export_state_dict()  # collective under ZeRO-3: every rank gathers
        saved[name] = {"losses": [r.loss for r in results], "stats": [r.stats for r in results],
                       "grad_norms": [r.grad_norms for r in results],
                       "tokens": [r.tokens_processed for r in results], "weights": weights}
    if rank == 0:
        torch.save(saved, out)
    leave()  # as the trainer's ranks end: exiting with the group up can abort in gloo's threads


def _run(world: int, *, model_dir: Path, out: Path) -> dict:
    mp.start_processes(_rank_main, args=(world, free_port(), str(model_dir), str(out)),
                       nprocs=world, start_method="spawn", join=True)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def steps(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    """{world size: {config name: what its rank 0 saw}}, both worlds from the same tiny model and samples."""
    out = tmp_path_factory.mktemp("ranks")
    return {world: _run(world, model_dir=tiny_model_dir, out=out / f"{world}.pt") for world in (1, 2)}


def test_share_gives_each_rank_every_wth_micro_batch_padded_to_the_busiest() -> None:
    batches = ["a", "b", "c", "d", "e"]
    assert share(batches, None) == [(b, 1.0) for b in batches]
    assert share(batches, Ranks(0, 2)) == [("a", 1.0), ("c", 1.0), ("e", 1.0)]
    assert share(batches, Ranks(1, 2)) == [("b", 1.0), ("d", 1.0), ("a", 0.0)]
    assert share(["a"], Ranks(2, 3)) == [("a", 0.0)]  # more ranks than micro-batches: padding only
    with pytest.raises(ValueError, match="expected at least one micro-batch"):
        share([], Ranks(0, 2))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_two_rank_zero_step_matches_the_one_rank_step(steps: dict[int, dict], name: str) -> None:
    one, two = steps[1][name], steps[2][name]
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5, abs=1e-7)
    assert two["tokens"] == one["tokens"]  # every real token trained once, padding not counted
    # The gradient itself, not only Adam's scale-free step: the same norm before clipping.
    for mine, theirs in zip(two["grad_norms"], one["grad_norms"], strict=True):
        assert mine == pytest.approx(theirs, rel=1e-5)
    for mine, theirs in zip(two["stats"], one["stats"], strict=True):
        assert mine.keys() == theirs.keys()
        assert mine == pytest.approx(theirs, rel=1e-4, abs=1e-6)
    assert two["weights"].keys() == one["weights"].keys()
    for name, tensor in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], tensor, rtol=0, atol=1e-5)


def test_several_ranks_without_deepspeed_are_refused_in_one_line_before_any_launch(db_session, tiny_model_dir) -> None:
    import subprocess
    import sys

    from tests.factories import make_run

    run = make_run(db_session, model=str(tiny_model_dir), group_size=2, batch_size=1)
    db_session.commit()
    url = db_session.get_bind().url.render_as_string(hide_password=False)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}, "CRUCIBLE_DATABASE_URL": url}
    root = Path(__file__).parents[2]

    def crucible(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli.main", "trainer", *args], env=env, cwd=root,
                              capture_output=True, text=True, timeout=120)

    refused = crucible("--run", str(run.id), "--nproc", "2", "--policy-url", "http://127.0.0.1:9/v1")
    assert refused.returncode != 0 and "torch.distributed.run" not in refused.stdout
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert f"expected run {run.id}'s config.trainer.deepspeed (e.g. {{stage: 3}}), got none" in lines[0]
    for bad in ("0", "65", "-1", "two"):
        wrong = crucible("--run", str(run.id), "--nproc", bad)
        assert wrong.returncode == 2 and "--nproc" in wrong.stderr and "Traceback" not in wrong.stderr, wrong.stderr
