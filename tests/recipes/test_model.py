"""`--model DIR` on the recipes (recipes/model.py, recipes/common.py): a directory that is not a model is
refused in one line naming what a model directory holds; a model's parameters are read from its
safetensors headers; resources are sized from them (a 135M model: 2048-token micro-batches, served in
float32 on every core; the tiny model: the defaults it always had)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import typer
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

import recipes.demo
from core.errors import ConfigError
from core.schemas.trainer import TrainerConfig
from recipes.common import RecipeSettings, policy_dir, with_model
from recipes.model import (
    PRETRAINED_LR,
    checked_model_dir,
    missing_parts,
    model_sizing,
    parameter_count,
    sizing_for,
)

SMOLLM2_135M = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
SMOLLM2_135M_PARAMETERS = 134_515_008  # tied embeddings: the 49152 × 576 matrix once


def test_a_directory_that_is_not_a_model_is_refused_in_one_line_naming_what_was_expected(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError) as caught:
        checked_model_dir(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path}: expected a model directory (config.json, *.safetensors weights")
    assert message.endswith("missing *.safetensors weights, a chat template (chat_template.jinja, or chat_template "
                            "in tokenizer_config.json)")
    assert missing_parts(tmp_path / "absent") == ["the directory itself"]
    with pytest.raises(ConfigError, match=r"expected a model directory .*, got no such directory$"):
        checked_model_dir(tmp_path / "absent")


def test_the_tiny_model_directory_is_a_model_and_its_parameters_are_counted_from_the_headers(
    tiny_model_dir: Path,
) -> None:
    assert missing_parts(tiny_model_dir) == []
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert parameter_count(tiny_model_dir) == sum(p.numel() for p in model.parameters())
    sizing = model_sizing(tiny_model_dir, max_model_len=1024)  # the tiny model keeps what it always had
    assert (sizing.micro_batch_tokens, sizing.activation_checkpointing, sizing.served_dtype, sizing.kv_cache_gib,
            sizing.serving_cores) == (8192, False, "float32", 1, None)


def test_a_135m_model_gets_small_micro_batches_float32_serving_and_every_core() -> None:
    sizing = sizing_for(parameters=SMOLLM2_135M_PARAMETERS, config=SMOLLM2_135M, max_model_len=2048, cores=(0, 1))
    assert (sizing.micro_batch_tokens, sizing.activation_checkpointing) == (2048, False)
    assert (sizing.served_dtype, sizing.kv_cache_gib, sizing.serving_cores) == ("float32", 1, (0, 1))
    trainer = TrainerConfig.model_validate(sizing.trainer_config(lr=2e-6))  # a valid run config
    assert trainer.optimizer.micro_batch_tokens == 2048 and trainer.served_dtype == "float32"


def test_a_larger_model_recomputes_activations_and_a_long_context_gets_a_larger_kv_cache() -> None:
    qwen_1_5b = {"num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "hidden_size": 1536}
    sizing = sizing_for(parameters=1_543_714_304, config=qwen_1_5b, max_model_len=32768, cores=(0,))
    assert sizing.activation_checkpointing and sizing.micro_batch_tokens < 2048
    # 56 KiB a token in float32 × 32768 tokens × 4 sequences × 2 headroom = 14 GiB
    assert sizing.kv_cache_gib == 14


def _invoke(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[RecipeSettings]]:
    ran: list[RecipeSettings] = []
    monkeypatch.setattr(recipes.demo, "run_demo", lambda settings, console: ran.append(settings))
    app = typer.Typer()
    app.command()(recipes.demo.demo)
    return CliRunner().invoke(app, args, env={"COLUMNS": "400", "NO_COLOR": "1"}), ran


def test_the_demo_takes_a_model_directory_and_trains_it_at_fine_tuning_rates(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, ran = _invoke(["--model", str(tiny_model_dir)], monkeypatch)
    assert result.exit_code == 0, result.output
    (settings,) = ran
    assert settings.model == tiny_model_dir.resolve() and settings.lr == PRETRAINED_LR
    assert policy_dir(settings, Path("/work")) == tiny_model_dir.resolve()
    result, ran = _invoke([], monkeypatch)  # the default: the tiny model the demo makes, its own rates
    assert result.exit_code == 0 and ran[0].model is None and ran[0].lr == RecipeSettings().lr
    assert policy_dir(ran[0], Path("/work")) == Path("/work/tiny")


def test_the_demo_refuses_a_directory_that_is_not_a_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         tiny_model_dir: Path) -> None:
    shutil.copytree(tiny_model_dir, tmp_path / "model")
    config = json.loads((tmp_path / "model" / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "model" / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "model" / "chat_template.jinja").unlink(missing_ok=True)
    result, ran = _invoke(["--model", str(tmp_path / "model")], monkeypatch)
    assert result.exit_code == 2 and not ran
    assert "expected a model directory" in result.output and "missing a chat template" in result.output
    with pytest.raises(ConfigError, match="missing a chat template"):
        with_model(RecipeSettings(), tmp_path / "model")


def test_a_tied_head_written_apart_counts_once(tmp_path: Path) -> None:
    """save_weights writes a tied model's head beside its embeddings (vLLM's CPU reload needs it): one matrix."""
    from safetensors import safe_open

    from trainer.tiny_model import TinyModelSpec, make_tiny_model
    from trainer.weight_sync import TIED_HEAD, save_weights

    tied = make_tiny_model(out_dir=tmp_path / "tied", seed=2, spec=TinyModelSpec(vocab_size=512, tied=True)).path
    model = AutoModelForCausalLM.from_pretrained(tied)
    save_weights(model=model, model_dir=tied)
    with safe_open(str(tied / "model.safetensors"), framework="pt") as weights:
        assert TIED_HEAD in weights.keys()  # noqa: SIM118
    assert parameter_count(tied) == sum(p.numel() for p in model.parameters())


def test_the_real_recipe_trains_the_model_it_is_given_or_the_imported_smollm2(tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    from rich.console import Console

    from recipes.real import SETTINGS, real_settings, smollm2

    given = real_settings(SETTINGS, model=tiny_model_dir, console=Console(file=None))
    assert given.model == tiny_model_dir.resolve()
    assert (given.sft_steps, given.lr) == (SETTINGS.sft_steps, SETTINGS.lr)  # the recipe's own sizes, kept
    imported = tmp_path / "models" / "smollm2"  # an earlier import: used as it is, nothing downloaded
    shutil.copytree(tiny_model_dir, imported)
    (imported / "import.json").write_text("{}")
    assert smollm2(data_dir=tmp_path, console=Console(file=None)) == imported
    with pytest.raises(ConfigError, match="expected a model directory"):
        real_settings(SETTINGS, model=tmp_path / "nothing", console=Console(file=None))
