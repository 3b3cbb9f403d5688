"""Off-policy bookkeeping the trainer can trust (issue 10), on real Postgres and the real tiny model:
sampling the trainer reproduces (refused at submission otherwise), non-finite steps skipped, one
trainer per run, the advantages the trainer used stored per episode, pass rates that follow the
policy, LoRA options applied. The trainer steps here never reach vLLM: they stop before the publish
(which needs a server; tests/trainer/test_training.py covers it), so no publisher is given.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import httpx
import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session
from transformers import AutoModelForCausalLM

from core.config_files import parse_model
from core.errors import ConfigError
from core.models import Episode, EpisodeGroup, Task, TrainingStep
from core.models.task_rate import RunTaskRate
from core.schemas import RunConfig
from core.schemas.run import Curriculum, Sampling
from task_workers.policy.client import PolicyClient
from tests.factories import add_group, make_environment, make_run
from trainer import metrics
from trainer.config import LoraConfig, TrainerConfig
from trainer.engine import TorchEngine
from trainer.errors import NonFiniteStep, TrainerAlreadyRunning
from trainer.loop import Trainer
from trainer.lora import apply_lora
from trainer.selection import StalenessRule
from trainer.serving import VllmServer
from trainer.step import generate
from trainer.store import PassOutcome, update_pass_rates

BASE = {"name": "r", "model": "m", "environments": [{"name": "e"}]}


def _refused(config: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_model(RunConfig, {**BASE, **config}, source="run config")
    return str(caught.value)


@pytest.mark.parametrize(("sampling", "field", "given"), [
    ({"temperature": 0}, "sampling.temperature", "got 0.0"),
    ({"top_p": 0.9}, "sampling.top_p", "got 0.9"),
    ({"top_k": 20}, "sampling.top_k", "got 20"),
    ({"min_p": 0.05}, "sampling.min_p", "got 0.05"),
    ({"repetition_penalty": 1.05}, "sampling.repetition_penalty", "got 1.05"),
])
def test_a_training_run_refuses_sampling_the_trainer_cannot_reproduce(sampling: dict, field: str, given: str) -> None:
    message = _refused({"sampling": sampling})
    assert field in message and "expected" in message and given in message
    # Held-out scoring may sample however it likes: nothing trains on it.
    assert parse_model(RunConfig, {**BASE, "purpose": "eval", "sampling": sampling}, source="run config")


def test_a_bad_trainer_value_is_refused_at_submission_naming_the_field() -> None:
    message = _refused({"trainer": {"loss": {"clip_low": 3}}})
    assert "trainer.loss.clip_low" in message and "less than 1" in message and "got 3" in message
    assert "trainer.optimizer.lrr" in _refused({"trainer": {"optimizer": {"lrr": 1.0}}})
    assert "lora.target_modules" in _refused({"trainer": {"lora": {"target_modules": []}}})


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty")
PINNED = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
          "presence_penalty": 0.0, "frequency_penalty": 0.0}


@pytest.mark.parametrize("generate_route", [True, False], ids=["inference-generate", "completions"])
def test_every_completion_request_sends_the_full_sampling_set(generate_route: bool) -> None:
    """The request body as the server receives it (an in-process transport records it: what is tested
    is what the client sends, whatever answers; the real vLLM answers in tests/trainer/test_training.py)."""
    bodies: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/weight_info":
            return httpx.Response(200, json={"weight_version": "3"})
        if request.url.path == "/inference/v1/generate":
            if not generate_route:
                return httpx.Response(404, json={"detail": "Not Found"})
            bodies.append(json.loads(request.content)["sampling_params"])
            return httpx.Response(200, json={"choices": [{
                "index": 0, "text": "x", "token_ids": [5, 6], "finish_reason": "stop",
                "logprobs": {"content": [{"token": "x", "logprob": -0.5}, {"token": "y", "logprob": -0.25}]},
                "weight_versions": [{"version": "3", "start": 0, "end": 1}, {"version": "4", "start": 1, "end": 2}]}]})
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": "x", "token_ids": [5], "finish_reason": "stop",
                                                      "logprobs": {"token_logprobs": [-0.5]}}]})

    client = PolicyClient(base_url="http://policy/v1", model="tiny", transport=httpx.MockTransport(answer))
    completion = client.complete(prompt_ids=[1, 2], max_tokens=4, sampling=Sampling(temperature=0.7))
    # Per-token spans where the server labels them, else the version before and after the request.
    assert completion.versions == (("3", "4") if generate_route else ("3", "3"))
    [body] = bodies
    assert {key: body[key] for key in SAMPLING_KEYS} == PINNED


def test_the_server_ignores_the_models_generation_defaults(tmp_path: Path) -> None:
    command = VllmServer(model_dir=tmp_path).command()
    assert command[command.index("--generation-config") + 1] == "vllm"


def test_a_non_finite_gradient_norm_applies_nothing(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    engine = TorchEngine(model=model, config=TrainerConfig())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss = sum(p.sum() for p in model.parameters()) * float("nan")
    engine.backward(loss)
    with pytest.raises(NonFiniteStep, match="gradient norm: expected a finite number, got nan"):
        engine.step()
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]), name
        assert param.grad is None


def _trainer(run_id: int, tmp_path: Path) -> Trainer:
    return Trainer(run_id=run_id, publisher=None, checkpoint_root=tmp_path / "ck")  # type: ignore[arg-type]


def _release(trainer: Trainer) -> None:
    """What `Trainer.close` does besides closing the (absent) publisher: give up the run's lock."""
    trainer._lock.release()


def test_a_step_with_a_non_finite_loss_is_skipped_dropped_and_never_checkpointed(
    db_session: Session, tiny_model_dir: Path, tokenizer, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    run = make_run(db_session, model=str(tiny_model_dir), group_size=2, batch_size=1)
    env, task = make_environment(db_session)
    group = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0], vocab=len(tokenizer))
    # A NaN behaviour logprob (a broken server) makes the importance weight, and so the loss, NaN.
    episode = db_session.execute(select(Episode).where(Episode.group_id == group.id, Episode.sample_index == 0)
                                 ).scalar_one()
    from core.models import Turn

    turn = db_session.execute(select(Turn).where(Turn.episode_id == episode.id, Turn.index == 0)).scalar_one()
    turn.logprobs = [*turn.logprobs[:-1], float("nan")]
    db_session.commit()
    trainer = _trainer(run.id, tmp_path)
    try:
        before = {name: p.detach().clone() for name, p in trainer.engine.module.named_parameters()}
        assert trainer.train_one_step() is None
        db_session.expire_all()
        assert db_session.get(EpisodeGroup, group.id).status == "dropped"  # type: ignore[union-attr]
        assert db_session.execute(select(TrainingStep).where(TrainingStep.run_id == run.id)).first() is None
        assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())
        for name, param in trainer.engine.module.named_parameters():
            assert torch.equal(param, before[name]), name
        assert trainer._skipped_steps == 1 and trainer.step == 0
        assert trainer._dropped_while_waiting.dropped == {group.id: "non_finite"}
    finally:
        _release(trainer)


def test_one_trainer_per_run(db_session: Session, tiny_model_dir: Path, tmp_path: Path) -> None:
    run = make_run(db_session, model=str(tiny_model_dir))
    db_session.commit()
    first = _trainer(run.id, tmp_path / "a")
    try:
        with pytest.raises(TrainerAlreadyRunning, match=f"run {run.id}: another trainer is already training it"):
            _trainer(run.id, tmp_path / "b")
    finally:
        _release(first)
    _release(_trainer(run.id, tmp_path / "c"))  # the lock went with the first trainer


def test_the_trainer_stores_the_advantages_it_used(
    db_session: Session, tiny_model_dir: Path, tokenizer, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Overlong shaping and std scaling on: the stored values are the trainer's, not any reward formula."""
    run = make_run(db_session, model=str(tiny_model_dir), group_size=4, batch_size=1,
                   trainer={"loss": {"scale_advantages_by_std": True, "overlong_max_tokens": 14,
                                     "overlong_buffer_tokens": 4}})
    env, task = make_environment(db_session)
    group = add_group(db_session, run=run, env=env, task=task, rewards=[1.0, 0.0, 0.5, 1.0], vocab=len(tokenizer))
    db_session.commit()
    trainer = _trainer(run.id, tmp_path)
    try:
        plan = generate(db_session, run_id=run.id, version=0, rule=StalenessRule.for_bound(1), batch_size=1, loss=trainer.config.loss)
        result = trainer._learn(plan, {})
        outcome = trainer._commit(db_session, plan, result, {})
    finally:
        _release(trainer)
    used = {s.episode_id: (s.advantage, s.score) for s in plan.samples}
    db_session.expire_all()
    stored = {e.id: (e.advantage, e.trained_score) for e in db_session.execute(
        select(Episode).where(Episode.group_id == group.id)).scalars()}
    assert stored == used  # double precision columns: exactly what the step used
    assert all(score < reward for (_, score), reward in zip(used.values(), [1.0, 0.0, 0.5, 1.0], strict=True))
    assert outcome.metrics[metrics.ADV_MEAN] == pytest.approx(statistics.fmean(a for a, _ in used.values()), abs=1e-6)


def test_pass_rates_follow_the_groups_the_trainer_examines(db_session: Session) -> None:
    env, task = make_environment(db_session)
    other = Task(environment_name=env.name, external_id="never-measured", instruction="x", payload={})
    db_session.add(other)
    task.pass_rate, task.pass_rate_samples = 0.5, 8
    run = make_run(db_session, model="unused")
    db_session.flush()
    curriculum = Curriculum(pass_rate_update=0.2)
    rates = update_pass_rates(db_session, run_id=run.id, curriculum=curriculum, outcomes=[
        PassOutcome(task.id, 1.0, {}, 3), PassOutcome(task.id, 1.0, {}, 3), PassOutcome(task.id, 1.0, {}, 4),
        PassOutcome(task.id, 1.0, {}, 4), PassOutcome(other.id, 0.0, {}, 4), PassOutcome(other.id, 1.0, {}, 4)])
    # The run's own count: 4 passes of 8 measured, discounted by 0.8, then 4 of 4: 7.2 of 10.4.
    assert rates == {task.id: pytest.approx(7.2 / 10.4), other.id: pytest.approx(0.5)}
    own = db_session.get(RunTaskRate, (run.id, task.id))
    assert own is not None and (own.samples, own.policy_version) == (pytest.approx(10.4), 4)
    assert (task.pass_rate, task.pass_rate_samples) == (0.5, 8)  # the job's measurement: no run moves it
    # A task the policy now always solves leaves the [0.1, 0.9] band after a few groups.
    for _ in range(8):
        update_pass_rates(db_session, run_id=run.id, curriculum=curriculum, outcomes=[PassOutcome(task.id, 1.0, {}, 5)] * 4)
    assert own.rate is not None and own.rate > 0.9


def test_lora_dropout_and_targets_are_applied_or_refused(tiny_model_dir: Path) -> None:
    model = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                       config=LoraConfig(rank=2, alpha=4, dropout=0.3, target_modules=["q_proj"]))
    dropouts = [m for name, m in model.named_modules() if name.endswith("lora_dropout.default")]
    assert dropouts and all(isinstance(m, torch.nn.Dropout) and math.isclose(m.p, 0.3) for m in dropouts)
    with pytest.raises(ConfigError, match=r"lora.target_modules: expected module names of the model, got.*qq_proj"):
        apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                   config=LoraConfig(target_modules=["q_proj", "qq_proj"]))
