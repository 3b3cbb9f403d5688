"""Push the engine's weights to the policy server and prove it serves them (the probe).

    publisher = Publisher(server=PolicyServer(...), syncer=make_weight_syncer("reload", ...), probe_ids=ids)
    report = publisher.push(engine=engine, version=8)   # WeightSyncError if the probe disagrees

Order: load (served under a provisional tag no worker accepts) → probe → tag `version`. A failed
probe rolls the server back to the previous weights and tag before WeightSyncError is raised.

The weights pushed are `engine.export_state_dict()`: full tensors under the checkpoint's names, LoRA
merged, ZeRO-3 gathered. The probe scores a fixed sequence with a plain model holding exactly those
weights (the engine's own module when that is already the case) and with vLLM.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.engine import PolicyEngine
from trainer.errors import WeightSyncError
from trainer.lora import is_lora
from trainer.probe import ProbeReport, verify_sync
from trainer.weight_sync import ServerControl, WeightSyncer


@dataclass(frozen=True)
class PolicyServer:
    """Where the policy is served: the OpenAI API root, the dev-route root, its model name and the
    directory it loaded (which the reload path rewrites)."""

    api_url: str
    base_url: str
    model_name: str
    model_dir: Path


@dataclass(frozen=True)
class SyncReport:
    version: int
    seconds: float
    """Export + push, not the probe."""
    probe: ProbeReport


class ExportedWeights(torch.nn.Module):
    """A state dict posing as a module, for `save_weights` (which reads `.config` and `.state_dict()`)."""

    def __init__(self, state: dict[str, torch.Tensor], config: Any) -> None:
        super().__init__()
        self._state = state
        self.config = config

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return self._state


class Publisher:
    def __init__(self, *, server: PolicyServer, syncer: WeightSyncer, probe_ids: list[int],
                 tolerance: float = 1e-3) -> None:
        self.server = server
        self.syncer = syncer
        self.probe_ids = probe_ids
        self.tolerance = tolerance
        self._probe_model: torch.nn.Module | None = None

    def _plain_model(self, engine: PolicyEngine, state: dict[str, torch.Tensor]) -> torch.nn.Module:
        """A plain Hugging Face model holding `state`: the engine's module if that is what it is."""
        module = engine.module
        sharded = hasattr(next(iter(module.parameters())), "ds_id")  # ZeRO-3 partitions parameters
        if not is_lora(module) and not sharded:
            return module
        if self._probe_model is None:
            base = module.get_base_model() if is_lora(module) else module  # type: ignore[operator]
            from transformers import AutoModelForCausalLM

            self._probe_model = AutoModelForCausalLM.from_config(copy.deepcopy(base.config)).eval()
        self._probe_model.load_state_dict(state)
        return self._probe_model

    def push(self, *, engine: PolicyEngine, version: int) -> SyncReport:
        """Raises WeightSyncError when the push fails or the server scores the probe differently."""
        started = time.perf_counter()
        state = engine.export_state_dict()
        config = getattr(engine.module, "config", None)
        self.syncer.load(model=ExportedWeights(state, config), version=version)
        seconds = time.perf_counter() - started
        try:
            report = verify_sync(model=self._plain_model(engine, state), api_url=self.server.api_url,
                                 model_name=self.server.model_name, token_ids=self.probe_ids,
                                 tolerance=self.tolerance)
        except WeightSyncError as error:
            self.syncer.rollback()
            raise WeightSyncError(f"version {version} not published, the previous weights serve again: "
                                  f"{error}") from error
        self.syncer.commit(version=version)
        return SyncReport(version=version, seconds=seconds, probe=report)

    def served_version(self) -> str | None:
        """The tag the server reports now ("default" after a restart, until it is re-synced)."""
        control = ServerControl(base_url=self.server.base_url, timeout_s=10.0)
        try:
            return control.version()
        finally:
            control.close()

    def close(self) -> None:
        self.syncer.close()
