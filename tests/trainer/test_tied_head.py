"""A model whose output layer is tied to its embeddings (most small pretrained chat models: Qwen2.5-0.5B,
SmolLM2) trains, and its pushed head takes effect on vLLM (issue 48, item 2). vLLM's CPU reload rebuilds
a layer's packed kernel only when the file has weights for it, so `save_weights` writes the head as a
tensor of its own; a file with the embeddings alone leaves the old head serving, which the probe sees."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from core.schemas.trainer import LoraConfig
from core.versions import Label
from trainer import weight_sync
from trainer.engine import export_weights
from trainer.errors import WeightSyncError
from trainer.lora import apply_lora, merged_state_dict
from trainer.probe import probe_token_ids, verify_sync
from trainer.serving import VllmServer, group_members
from trainer.tiny_model import TinyModelSpec, make_tiny_model
from trainer.weight_sync import TIED_HEAD, ReloadWeightSyncer, save_weights

AGREE = 1e-3  # float32 on both sides: the probe's tolerance


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tied") / "model"
    make_tiny_model(out_dir=directory, seed=3, spec=TinyModelSpec(vocab_size=512, max_position=1024, tied=True))
    return directory


def _trained_one_step(model: PreTrainedModel, *, seed: int) -> PreTrainedModel:
    """One AdamW step on a language-model loss: every weight moves, the tied matrix included."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, model.config.vocab_size, (2, 24), generator=generator)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-2)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return model.eval()


def test_a_tied_model_stays_tied_through_a_step_and_its_head_is_written_apart(tied_dir: Path, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tied_dir)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    before = model.lm_head.weight.detach().clone()
    _trained_one_step(model, seed=0)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # one matrix, trained once
    assert not torch.equal(model.lm_head.weight, before)
    (tmp_path / "config.json").write_text("{}")
    written = load_file(save_weights(model=model, model_dir=tmp_path))
    assert torch.equal(written[TIED_HEAD], written["model.embed_tokens.weight"])
    assert torch.equal(written[TIED_HEAD], model.lm_head.weight.detach())
    state = export_weights(model)  # what the trainer pushes (trainer.sync.ExportedWeights carries it)
    assert TIED_HEAD in state and torch.equal(state[TIED_HEAD], state["model.embed_tokens.weight"])
    merged = merged_state_dict(apply_lora(AutoModelForCausalLM.from_pretrained(tied_dir),  # type: ignore[arg-type]
                                          config=LoraConfig(rank=2, alpha=4)))
    assert torch.equal(merged[TIED_HEAD], merged["model.embed_tokens.weight"])  # a LoRA merge keeps them one


@pytest.fixture(scope="module")
def served_tied(tied_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    served = Path(shutil.copytree(tied_dir, tmp_path_factory.mktemp("served-tied") / "model"))
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(VllmServer(model_dir=served, served_model_name="tied", max_model_len=1024,
                                                log_path=served.parent / "server.log", startup_timeout_s=600))
        yield server
    assert server.pid is None or group_members(server.pid) == [], "vLLM outlived stop()"


@pytest.mark.slow  # its own vLLM server (~1 min on 2 shared cores); `make test-all` runs it
def test_a_tied_head_pushed_to_vllm_takes_effect_and_an_embeddings_only_file_would_not(
    served_tied: VllmServer, tied_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tied_dir)
    kwargs: dict[str, Any] = {"api_url": served_tied.api_url, "model_name": served_tied.model_name,
              "token_ids": probe_token_ids(tokenizer)}
    syncer = ReloadWeightSyncer(base_url=served_tied.base_url, model_dir=served_tied.model_dir)
    try:
        trained = _trained_one_step(AutoModelForCausalLM.from_pretrained(tied_dir), seed=1)
        syncer.push(model=trained, label=Label.fresh(1, run=None))
        report = verify_sync(model=trained, tolerance=AGREE, **kwargs)  # the server's logits, head included
        assert report.mean_abs_diff <= AGREE

        # The control: the file the old refusal guarded against, embeddings alone. The server keeps the
        # previous head (its packed copy), and the probe refuses the push.
        again = _trained_one_step(AutoModelForCausalLM.from_pretrained(tied_dir), seed=2)
        real_save_file = weight_sync.save_file
        monkeypatch.setattr(weight_sync, "save_file", lambda state, path, **kw: real_save_file(
            {name: tensor for name, tensor in state.items() if name != TIED_HEAD}, path, **kw))
        syncer.push(model=again, label=Label.fresh(2, run=None))
        with pytest.raises(WeightSyncError, match="vLLM disagrees with the trainer's weights"):
            verify_sync(model=again, tolerance=AGREE, **kwargs)
        monkeypatch.undo()
        syncer.push(model=again, label=Label.fresh(3, run=None))
        verify_sync(model=again, tolerance=AGREE, **kwargs)
    finally:
        syncer.close()
