"""GPU weight sync over NCCL with vLLM's weight-transfer API. UNTESTED HERE: it needs CUDA on both sides.

Written against vLLM 0.32's trainer-side API (`vllm.distributed.weight_transfer`), following
`docs/training/weight_transfer/nccl.md` and `examples/rl/rlhf_http_nccl.py`. The server must run with
`--weight-transfer-config '{"backend": "nccl"}'` and `VLLM_SERVER_DEV_MODE=1`. The trainer process
is NCCL rank 0 (the sender); the server's workers take ranks 1..world_size-1.

One load: `/pause?mode=keep` → `start_weight_update` → `update_weights` concurrently with the
broadcast → `finish_weight_update` (all inside `send_weights`) → `/reset_prefix_cache` →
`/update_weight_version` (provisional tag) → `/resume`; `commit` tags the version. The server keeps no
copy of the previous weights, so `rollback` pauses it under the previous tag instead. The NCCL group is formed on the first push (rendezvous with
the server at `master_address:master_port`) and reused after.

A tied output layer travels once: `ModuleSource` sends the model's parameters, and a tied model's head is
its embeddings' Parameter, so only `embed_tokens` is sent; vLLM's GPU models tie `lm_head` to that same
tensor, so the head follows (the CPU reload path writes the head apart: trainer/weight_sync.py). The
probe after every load checks the served logits, head included.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from core.versions import Label
from trainer.weight_sync import ServerControl

log = logging.getLogger(__name__)


class NcclWeightSyncer:
    """Broadcast parameters from this (rank-0) trainer process to the vLLM workers over NCCL."""

    def __init__(
        self, *, base_url: str, master_address: str, master_port: int, world_size: int, timeout_s: float = 300.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.master_address = master_address
        self.master_port = master_port
        self.world_size = world_size  # 1 trainer sender + every vLLM worker (TP × PP × DP)
        self.timeout_s = timeout_s
        self.control = ServerControl(base_url=base_url, timeout_s=timeout_s)
        self._engine: Any = None
        self._model: torch.nn.Module | None = None
        self._previous_tag: str | None = None

    def _connect(self, model: torch.nn.Module) -> Any:
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        init_info = NCCLTrainerInitInfo(
            master_address=self.master_address, master_port=self.master_port,
            world_size=self.world_size, rank=0, packed=True,  # packed: few large broadcasts, not one per tensor
        )
        return WeightTransferTrainerFactory.trainer_init(
            init_info,
            client=HTTPVLLMWeightSyncClient(self.base_url, timeout=self.timeout_s),
            source=ModuleSource(model),  # names as in the HF checkpoint; vLLM maps them in load_weights
        )

    def load(self, *, model: torch.nn.Module, label: Label) -> float:
        started = time.perf_counter()
        self._previous_tag = self.control.version()
        if self._engine is None or self._model is not model:
            self._engine, self._model = self._connect(model), model
        self.control.pause()
        self._engine.send_weights()
        self.control.reset_prefix_cache()
        self.control.set_version(str(label))
        self.control.resume()
        seconds = time.perf_counter() - started
        log.info("weights %s broadcast over NCCL in %.3f s", label, seconds)
        return seconds

    def commit(self, *, label: Label) -> None:
        self.control.set_version(str(label.committed))

    def rollback(self) -> None:
        self.control.pause()
        self.control.set_version(self._previous_tag or "default")
        log.warning("probe failed: vLLM paused under the previous tag %r (NCCL keeps no old weights)",
                    self._previous_tag)

    def push(self, *, model: torch.nn.Module, label: Label) -> float:
        seconds = self.load(model=model, label=label)
        self.commit(label=label)
        return seconds

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        self.control.close()
