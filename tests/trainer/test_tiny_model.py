"""`make_tiny_model` and `crucible model init-tiny`: a deterministic Qwen2 model that HF and vLLM load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase
from typer.testing import CliRunner

from cli.model import app
from core.errors import ConfigError
from trainer.tiny_model import TinyModelSpec, make_tiny_model

TEXTS = [
    "git diff --stat && python -m pytest -x -q",
    "def add(a, b):\n    return a + b  # ünïcode ✓ 日本語\n",
    '{"name": "bash", "arguments": {"command": "ls -la"}}',
    "  two  spaces,\ttabs and\r\nCRLF 🙂",
]
TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
EPISODE: list[Any] = [
    {"role": "system", "content": "You solve tasks."},
    {"role": "user", "content": "List the files."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
    {"role": "assistant", "content": "Two files.", "tool_calls": [
        {"type": "function", "function": {"name": "submit", "arguments": {}}}]},
]


def test_same_seed_gives_identical_files(tiny_model_dir: Path, tmp_path: Path) -> None:
    again = make_tiny_model(out_dir=tmp_path / "again", seed=0).path
    names = sorted(p.name for p in tiny_model_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_other_seed_changes_weights_not_tokenizer(tiny_model_dir: Path, tmp_path: Path) -> None:
    other = make_tiny_model(out_dir=tmp_path / "other", seed=1).path
    assert (other / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (tiny_model_dir / "model.safetensors").read_bytes()


def test_auto_classes_load_an_untied_qwen2(tiny_model_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = model.config
    assert config.model_type == "qwen2" and not config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert config.hidden_size // config.num_attention_heads >= 32
    assert config.vocab_size == len(tokenizer) and 2000 <= len(tokenizer) <= 4096
    assert next(model.parameters()).dtype.is_floating_point
    assert list((tiny_model_dir).glob("*.safetensors")) == [tiny_model_dir / "model.safetensors"]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trips(tokenizer: PreTrainedTokenizerBase, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode())  # BPE merges happened


def test_chat_markers_are_single_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    for marker in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]:
        assert len(tokenizer.encode(marker, add_special_tokens=False)) == 1, marker
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    # Tool-call framing survives skip_special_tokens (vLLM's default when detokenizing), ChatML does not.
    ids = tokenizer.encode('<|im_start|>assistant\n<tool_call>\n{"name": "x"}\n</tool_call><|im_end|>')
    assert tokenizer.decode(ids, skip_special_tokens=True) == 'assistant\n<tool_call>\n{"name": "x"}\n</tool_call>'


def test_chat_template_renders_tools_calls_and_results(tokenizer: PreTrainedTokenizerBase) -> None:
    text = cast(str, tokenizer.apply_chat_template(EPISODE, tools=TOOLS, tokenize=False, add_generation_prompt=True))
    assert text.startswith("<|im_start|>system\nYou solve tasks.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]) in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>tool\na.py\nb.py<|im_end|>\n" in text
    assert 'Two files.\n<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = tokenizer.apply_chat_template(EPISODE[1:2], tokenize=False)
    assert plain == "<|im_start|>user\nList the files.<|im_end|>\n"  # no tools, no system: no system turn


def test_chat_template_extends_token_exactly(tokenizer: PreTrainedTokenizerBase) -> None:
    """Each turn's prompt (with the generation header) is a token prefix of the longer episode."""
    for end in range(2, len(EPISODE)):
        prompt = tokenizer.apply_chat_template(EPISODE[:end], tools=TOOLS, add_generation_prompt=True,
                                               return_dict=False)
        full = tokenizer.apply_chat_template(EPISODE[: end + 1], tools=TOOLS, return_dict=False)
        if EPISODE[end]["role"] == "assistant":
            assert full[: len(prompt)] == prompt


@pytest.mark.parametrize(("spec", "needle"), [
    (TinyModelSpec(hidden=64, heads=4), "head dim"),
    (TinyModelSpec(heads=4, kv_heads=3), "--kv-heads"),
    (TinyModelSpec(vocab_size=100), "--vocab-size"),
])
def test_bad_specs_are_refused(tmp_path: Path, spec: TinyModelSpec, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_tiny_model(out_dir=tmp_path / "m", spec=spec)
    assert not (tmp_path / "m").exists()


def test_refuses_a_directory_with_files(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="empty or new directory"):
        make_tiny_model(out_dir=tmp_path)


def test_cli_init_tiny(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["init-tiny", str(tmp_path / "cli"), "--seed", "3", "--layers", "1"])
    assert result.exit_code == 0, result.output
    assert "parameters" in result.output
    assert json.loads((tmp_path / "cli" / "crucible_tiny.json").read_text())["seed"] == 3
    bad = runner.invoke(app, ["init-tiny", str(tmp_path / "bad"), "--hidden", "64", "--heads", "4"])
    assert bad.exit_code == 2
    assert "head dim" in bad.output
