"""The cost of every training step: time and tokens per stage, FLOPs, achieved FLOP/s, MFU.

Written into `training_steps.metrics` (JSONB, no extra column) under `cost/…`, read by the run page
(`api.services.run_cost`) and `crucible run cost RUN`:

    cost/rollout/seconds     Σ over the step's trained episodes of their episode time minus grading
                             (lease, setup, policy generation, sandbox steps): `episodes.timings`
    cost/rollout/generation_seconds   of which waiting on the policy (vLLM)
    cost/rollout/tokens      tokens of those episodes (prompt, environment and sampled)
    cost/rollout/sampled_tokens       of which sampled by the policy
    cost/update/seconds      the actor update (forward, backward, optimizer) without the reference forward
    cost/update/tokens       tokens through the actor's forward and backward (all epochs), counted
    cost/reference/seconds   the reference model's forward (KL term; 0 when β = 0), timed by hooks
    cost/reference/tokens    tokens through it, counted
    cost/reward/seconds      Σ grading time (`episodes.timings.verify`) of the trained episodes
    cost/reward/episodes     episodes graded
    cost/step/seconds        the trainer's time for the step: claim, score, advantages, update, checkpoint
    cost/params_active       N_active: parameters a token passes through (all but the input embedding
                             table, which is a lookup, not a matmul)
    cost/flops               6·N_active·update tokens + 2·N_active·reference tokens (forward 2N, backward 4N)
    cost/flops_per_s         cost/flops ÷ (update + reference seconds): achieved FLOP/s
    cost/mfu                 achieved ÷ the device's peak, when the peak is known (CUDA devices in
                             PEAK_FLOPS, or CRUCIBLE_PEAK_FLOPS); null on CPU

The projection (`gpu_hours`) is: GPU-hours = target steps × median cost/step/seconds × GPUs ÷ 3600 —
measured step time, not FLOPs over an assumed MFU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Episode
from core.settings import get_settings

if TYPE_CHECKING:  # torch is imported where it is used: the API and CLI read this module's names
    import torch

    from trainer.rollouts import Sample

PREFIX = "cost/"
ROLLOUT_S, ROLLOUT_GEN_S = "cost/rollout/seconds", "cost/rollout/generation_seconds"
ROLLOUT_TOKENS, ROLLOUT_SAMPLED = "cost/rollout/tokens", "cost/rollout/sampled_tokens"
UPDATE_S, UPDATE_TOKENS = "cost/update/seconds", "cost/update/tokens"
REFERENCE_S, REFERENCE_TOKENS = "cost/reference/seconds", "cost/reference/tokens"
REWARD_S, REWARD_EPISODES = "cost/reward/seconds", "cost/reward/episodes"
STEP_S = "cost/step/seconds"
PARAMS = "cost/params_active"
FLOPS, FLOPS_PER_S, MFU = "cost/flops", "cost/flops_per_s", "cost/mfu"
STAGES = ("rollout", "update", "reference", "reward")
"""The stages of the breakdown, in the order the run page and the CLI show them."""

# Dense bf16 tensor-core peaks (FLOP/s) by device name; the trainer's dtype may be lower (fp32):
# then the MFU is against this peak, i.e. pessimistic. CRUCIBLE_PEAK_FLOPS overrides.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12}


def active_parameters(module: torch.nn.Module) -> int:
    """Parameters a token's forward passes through: all, less the input embedding table (a lookup)."""
    import torch

    total = sum(p.numel() for p in module.parameters())
    embeddings = getattr(module, "get_input_embeddings", lambda: None)()
    output = getattr(module, "get_output_embeddings", lambda: None)()
    if isinstance(embeddings, torch.nn.Module) and embeddings is not output:
        tied = output is not None and getattr(output, "weight", None) is getattr(embeddings, "weight", None)
        if not tied:  # a tied table is also the output layer: it is a matmul there, keep it
            total -= sum(p.numel() for p in embeddings.parameters())
    return int(total)


def peak_flops(device: torch.device | str | None = None) -> float | None:
    """The device's peak FLOP/s, or None when unknown (CPU, or a GPU not in PEAK_FLOPS)."""
    override = get_settings().peak_flops
    if override is not None:
        return override
    import torch

    device = torch.device(device or "cpu")
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)


class ForwardTimer:
    """Times a module's forwards (and counts their tokens) with hooks, without touching the caller:
    the reference model is called through its decoder and its head separately (trainer.logprobs),
    so both are hooked."""

    def __init__(self, module: torch.nn.Module) -> None:
        from trainer.logprobs import decoder_and_head

        self.seconds, self.tokens = 0.0, 0
        self._started: dict[int, float] = {}
        decoder, head = decoder_and_head(module)
        self._handles = []
        for part, counts in ((decoder, True), (head, False)):
            self._handles.append(part.register_forward_pre_hook(self._pre(counts), with_kwargs=True))
            self._handles.append(part.register_forward_hook(self._post, always_call=True))

    def _pre(self, counts_tokens: bool) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if counts_tokens:
                mask = kwargs.get("attention_mask")
                ids = kwargs.get("input_ids", args[0] if args else None)
                self.tokens += int(mask.sum()) if mask is not None else int(ids.numel()) if ids is not None else 0
            self._started[id(module)] = time.perf_counter()
        return hook

    def _post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        started = self._started.pop(id(module), None)
        if started is not None:
            self.seconds += time.perf_counter() - started

    def take(self) -> tuple[float, int]:
        """(seconds, tokens) since the last take."""
        out = (self.seconds, self.tokens)
        self.seconds, self.tokens = 0.0, 0
        return out

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def episode_timings(session: Session, episode_ids: Iterable[int]) -> dict[int, Mapping[str, float]]:
    ids = list(episode_ids)
    if not ids:
        return {}
    rows = session.execute(select(Episode.id, Episode.timings).where(Episode.id.in_(ids))).all()
    return {episode_id: timings or {} for episode_id, timings in rows}


def step_cost(
    *, samples: list[Sample], timings: Mapping[int, Mapping[str, float]], update_seconds: float,
    update_tokens: int, reference_seconds: float, reference_tokens: int, step_seconds: float, params_active: int,
    peak: float | None,
) -> dict[str, float | None]:
    """The step's cost metrics (see the module docstring). `update_seconds` includes the reference
    forward (it runs inside the update); it is taken out here."""
    def seconds(episode_id: int, key: str) -> float:
        value = (timings.get(episode_id) or {}).get(key)  # stored JSON: anything but a number counts 0
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0

    def total(key: str) -> float:
        return sum(seconds(s.episode_id, key) for s in samples)

    actor_s = max(update_seconds - reference_seconds, 0.0)
    flops = 6.0 * params_active * update_tokens + 2.0 * params_active * reference_tokens
    compute_s = actor_s + reference_seconds
    achieved = flops / compute_s if compute_s > 0 else None
    return {
        ROLLOUT_S: total("total") - total("verify"), ROLLOUT_GEN_S: total("generation"),
        ROLLOUT_TOKENS: float(sum(len(s.token_ids) for s in samples)),
        ROLLOUT_SAMPLED: float(sum(s.sampled_tokens for s in samples)),
        UPDATE_S: actor_s, UPDATE_TOKENS: float(update_tokens),
        REFERENCE_S: reference_seconds, REFERENCE_TOKENS: float(reference_tokens),
        REWARD_S: total("verify"), REWARD_EPISODES: float(len(samples)),
        STEP_S: step_seconds, PARAMS: float(params_active), FLOPS: flops, FLOPS_PER_S: achieved,
        MFU: achieved / peak if achieved is not None and peak else None,
    }


PROJECTION_FORMULA = "GPU-hours = target steps × median measured step seconds (cost/step/seconds) × GPUs ÷ 3600"


def gpu_hours(*, step_seconds: list[float], target_steps: int, gpus: int = 1) -> float:
    """PROJECTION_FORMULA (shown with every projection, by the API and the CLI)."""
    if target_steps < 1:
        raise ValueError(f"target steps: expected a positive integer, got {target_steps}")
    if gpus < 1:
        raise ValueError(f"gpus: expected a positive integer, got {gpus}")
    if not step_seconds:
        raise ValueError("step seconds: expected at least one recorded step, got none")
    return target_steps * statistics.median(step_seconds) * gpus / 3600.0


class CostMeter:
    """What the trainer loop holds: the reference timer, N_active and the device peak, fixed per run.

        meter = CostMeter(policy=engine.module, reference=reference)
        meter.begin()                                        # before the step's update
        values.update(meter.record(session, samples=..., result=..., timings=...))
    """

    def __init__(self, *, policy: torch.nn.Module, reference: torch.nn.Module | None) -> None:
        self.params_active = active_parameters(policy)
        self.peak = peak_flops(next(policy.parameters()).device)
        self._reference = ForwardTimer(reference) if reference is not None else None

    def begin(self) -> None:
        if self._reference is not None:
            self._reference.take()  # forget forwards outside the step (e.g. of a skipped step)

    def record(self, session: Session, *, samples: list[Sample], update_seconds: float, update_tokens: int,
               timings: Mapping[str, float]) -> dict[str, float | None]:
        reference_s, reference_tokens = self._reference.take() if self._reference is not None else (0.0, 0)
        values = step_cost(
            samples=samples, timings=episode_timings(session, (s.episode_id for s in samples)),
            update_seconds=update_seconds, update_tokens=update_tokens, reference_seconds=reference_s,
            reference_tokens=reference_tokens, step_seconds=sum(timings.values()), params_active=self.params_active,
            peak=self.peak)
        return {key: None if value is None else round(float(value), 6) for key, value in values.items()}
