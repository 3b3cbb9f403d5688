"""A GGUF file → a Hugging Face model directory: float32 safetensors, config, tokenizer (trainer/model_import.py
calls it and checks the result).

Read with `gguf`, not through transformers: transformers refuses `save_pretrained` on a GGUF-loaded
model, and its GGUF tokenizer drops the pre-tokenizer GGUF names only by a key
(`tokenizer.ggml.pre = smollm`: digits one by one), so numbers would tokenize unlike the model was
trained. Here every quantized tensor is dequantized to float32, llama.cpp's query/key row order is
undone, and the pre-tokenizer is rebuilt from that key; an unknown key is refused, not guessed.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.errors import ImportRefused

GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
"""GGUF `general.architecture` → the Hugging Face class its tensors map to."""
# The pre-tokenizers GGUF names by `tokenizer.ggml.pre` (llama.cpp's llama-vocab.cpp), as Hugging Face
# tokenizers components. Byte-level BPE applies the regex split, then maps bytes to symbols.
_GPT2 = "gpt2"
_QWEN2_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
_LLAMA3_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
DIGIT_GROUP = {"smollm": 1, "qwen2": 1, "llama-bpe": 3, "gpt2": None, "default": None}
"""The longest run of digits one token may hold under each pre-tokenizer (None: no rule)."""
MAX_ARRAY_ITEMS = 1 << 22
"""The most items a GGUF metadata array may hold: a vocabulary or its merges (the largest known, ~262k)."""
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type → size
_STRING, _ARRAY, _TENSOR_INFO_BYTES = 8, 9, 24  # a tensor's info: name length, n_dims, type, offset at least

@dataclass
class Converted:
    architecture: str
    pre_tokenizer: str
    family_hint: str


def convert_gguf(path: Path, out: Path) -> Converted:
    _check_gguf_counts(path)
    reader = _gguf_reader(path)
    fields = _gguf_fields(reader)
    arch = fields.get("general.architecture")
    if not isinstance(arch, str) or arch not in GGUF_ARCHITECTURES:
        raise ImportRefused(f"expected a GGUF model of architecture {' or '.join(GGUF_ARCHITECTURES)}, got {arch!r} "
                            f"in {path.name}")
    config = _gguf_config(fields, arch=arch, tied=not any(t.name == "output.weight" for t in reader.tensors))
    # GGUF lists a tensor's dimensions innermost first; the shapes below are PyTorch's (outermost first).
    model = meta_model_fitting(config, {_hf_name(t.name): tuple(int(d) for d in reversed(t.shape))
                                        for t in reader.tensors})
    state = _gguf_state(reader, arch=arch, config=config)
    _save_model(model, config, state, out)
    template = fields.get("tokenizer.chat_template")
    pre = _gguf_tokenizer(fields, out, chat_template=template if isinstance(template, str) else None)
    return Converted(architecture=GGUF_ARCHITECTURES[arch], pre_tokenizer=pre, family_hint=arch)


def brief(error: BaseException, limit: int = 200) -> str:
    """An error's text as one line (a library's message may span several), cut to `limit` characters."""
    return " ".join(str(error).split())[:limit]


def _check_gguf_counts(path: Path) -> None:
    """Every count in the GGUF header (keys, array items, string bytes, tensors) checked against the bytes
    the file has left, before gguf reads it: gguf's reader loops over an array's count unchecked (one that
    claims 10^9 items in a 1 kB file hangs it, building a Python object per item)."""
    with path.open("rb") as handle:
        head = handle.read(24)
    if len(head) < 24 or head[:4] != b"GGUF":
        raise ImportRefused(f"expected a GGUF file (b'GGUF', a version and two counts), got {path.name} starting "
                            f"with {head[:8]!r}")
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
        size = len(view)
        order = ">" if size >= 8 and struct.unpack_from("<I", view, 4)[0] & 0xFFFF == 0 else "<"

        def need(at: int, length: int, what: str) -> int:
            if at + length > size:
                raise ImportRefused(f"expected a complete GGUF file, got {path.name} whose {what} at byte {at} runs "
                                    f"past its end ({size} bytes); a truncated download?")
            return at + length

        def number(fmt: str, at: int, what: str) -> tuple[int, int]:
            end = need(at, struct.calcsize(fmt), what)
            return int(struct.unpack_from(order + fmt, view, at)[0]), end

        def skip(kind: int, at: int, key: str, depth: int = 0) -> int:
            if kind in _SCALAR_BYTES:
                return need(at, _SCALAR_BYTES[kind], f"value of {key!r}")
            if kind == _STRING:
                length, at = number("Q", at, f"string length in {key!r}")
                return need(at, length, f"string in {key!r}")
            if kind != _ARRAY or depth > 2:
                raise ImportRefused(f"expected GGUF values of the types gguf writes, got type {kind} in {key!r}")
            item, at = number("I", at, f"array type of {key!r}")
            count, at = number("Q", at, f"array length of {key!r}")
            if count > MAX_ARRAY_ITEMS:
                raise ImportRefused(f"expected GGUF arrays of at most {MAX_ARRAY_ITEMS} items (a vocabulary), got "
                                    f"{key!r} claiming {count}")
            if item in _SCALAR_BYTES:
                return need(at, count * _SCALAR_BYTES[item], f"{count} items of {key!r}")
            for _ in range(count):
                at = skip(item, at, key, depth + 1)
            return at

        tensors, at = number("Q", 8, "tensor count")
        keys, at = number("Q", at, "key count")
        for _ in range(keys):  # a key takes 12 bytes at least: a lying count runs out of file, quickly
            length, at = number("Q", at, "key length")
            key_end = need(at, length, "key")
            key = bytes(view[at:min(key_end, at + 80)]).decode("utf-8", "replace")
            kind, at = number("I", key_end, f"type of {key!r}")
            at = skip(kind, at, key)
        need(at, tensors * _TENSOR_INFO_BYTES, f"list of {tensors} tensors")


def _gguf_reader(path: Path) -> Any:
    import gguf

    try:
        return gguf.GGUFReader(path)
    except Exception as error:  # gguf raises ValueError, struct.error, IndexError… on a bad or cut file
        raise ImportRefused(f"expected a complete GGUF file, got {path.name} that gguf cannot read "
                            f"({type(error).__name__}: {brief(error)}); a truncated download?") from None


def _gguf_fields(reader: Any) -> dict[str, Any]:
    out = {}
    for name, value in reader.fields.items():
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            out[name] = [_utf8(bytes(value.parts[i]), key=name, index=n) for n, i in enumerate(value.data)]
        elif name in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            out[name] = [value.parts[i][0].item() for i in value.data]
        else:
            try:
                out[name] = value.contents()
            except Exception:  # a field of a type gguf does not decode: not one we read
                continue
    return out


def _utf8(raw: bytes, *, key: str, index: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ImportRefused(f"expected {key} to hold UTF-8 strings, got item {index}: {raw[:40]!r}") from None


def _need(fields: dict[str, Any], key: str) -> Any:
    if key not in fields:
        raise ImportRefused(f"expected the GGUF key {key!r}, got a file without it")
    return fields[key]


def _positive(fields: dict[str, Any], key: str, default: float | None = None, *, kind: type = int) -> Any:
    """A size or constant of the model: a positive number of `kind` (a GGUF can hold any type under any key)."""
    value = fields.get(key, default) if default is not None else _need(fields, key)
    number = isinstance(value, int | float) and not isinstance(value, bool) and (kind is float or isinstance(value, int))
    if not number or not 0 < value < float("inf"):
        raise ImportRefused(f"expected {key} to be a positive {'integer' if kind is int else 'number'}, got {value!r}")
    return kind(value)


def _gguf_config(fields: dict[str, Any], *, arch: str, tied: bool) -> Any:
    from transformers import AutoConfig

    hidden = _positive(fields, f"{arch}.embedding_length")
    heads = _positive(fields, f"{arch}.attention.head_count")
    head_dim = _positive(fields, f"{arch}.rope.dimension_count", max(hidden // heads, 1))
    if fields.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ImportRefused(f"expected a model without rope scaling, got {fields[f'{arch}.rope.scaling.type']!r}")
    tokens = _need(fields, "tokenizer.ggml.tokens")
    if len(set(tokens)) != len(tokens):
        raise ImportRefused(f"expected distinct tokens in tokenizer.ggml.tokens, got {len(tokens) - len(set(tokens))} "
                            "repeated (a token would have two ids)")
    kwargs = {
        "hidden_size": hidden, "num_hidden_layers": _positive(fields, f"{arch}.block_count"),
        "num_attention_heads": heads, "num_key_value_heads": _positive(fields, f"{arch}.attention.head_count_kv", heads),
        "intermediate_size": _positive(fields, f"{arch}.feed_forward_length"),
        "max_position_embeddings": _positive(fields, f"{arch}.context_length"),
        "rms_norm_eps": _positive(fields, f"{arch}.attention.layer_norm_rms_epsilon", kind=float),
        "rope_theta": _positive(fields, f"{arch}.rope.freq_base", 10000.0, kind=float),
        "vocab_size": _positive(fields, f"{arch}.vocab_size", max(len(tokens), 1)),
        "tie_word_embeddings": tied, "head_dim": head_dim,
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"), "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": fields.get("tokenizer.ggml.padding_token_id"), "torch_dtype": "float32",
    }
    if head_dim * heads != hidden:
        raise ImportRefused(f"expected heads × head dim = hidden, got {heads} × {head_dim} ≠ {hidden}")
    if kwargs["vocab_size"] != len(tokens):
        raise ImportRefused(f"expected the vocabulary ({len(tokens)} tokens) to match {arch}.vocab_size, got "
                            f"{kwargs['vocab_size']}")
    config = AutoConfig.for_model({"llama": "llama", "qwen2": "qwen2"}[arch], **kwargs)
    config.architectures = [GGUF_ARCHITECTURES[arch]]  # vLLM and TRL pick the model class by it
    check_token_ids(config)
    return config


def check_token_ids(config: Any) -> None:
    """The special token ids the config names are ids of the vocabulary (generation stops on them)."""
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, key, None)
        for token_id in value if isinstance(value, list) else [value]:
            if token_id is not None and (isinstance(token_id, bool) or not isinstance(token_id, int)
                                         or not 0 <= token_id < config.vocab_size):
                raise ImportRefused(f"expected {key} to be a token id below the vocabulary size {config.vocab_size}, "
                                    f"got {token_id!r}")


def meta_model_fitting(config: Any, shapes: dict[str, tuple[int, ...]]) -> Any:
    """The config's model, on the meta device (nothing allocated), once the weights (name → shape, read
    from the file's header) are checked to fill it exactly: a config that claims more layers or wider
    ones than the weights hold is refused before any memory follows its numbers."""
    import torch
    from transformers import AutoModelForCausalLM

    layers = {name.split(".")[2] for name in shapes if name.startswith("model.layers.")}
    declared = config.num_hidden_layers
    if not isinstance(declared, int) or layers != {str(i) for i in range(declared)}:
        raise ImportRefused(f"expected the weights to hold the {declared!r} layers the config declares, got "
                            f"{len(layers)} layers")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()
                if not name.endswith("inv_freq")}
    optional = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = sorted(set(expected) - set(shapes) - optional)
    unexpected = sorted(name for name in set(shapes) - set(expected) if not name.endswith("inv_freq"))
    if missing or unexpected:
        raise ImportRefused(f"expected the weights to fill {type(model).__name__} exactly, got missing "
                            f"{missing[:4]} and unexpected {unexpected[:4]}")
    for name, shape in sorted(shapes.items()):
        if name in expected and shape != expected[name]:
            raise ImportRefused(f"expected {name} of shape {expected[name]} (from the config), got {shape}")
    return model


_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


def _gguf_state(reader: Any, *, arch: str, config: Any) -> dict[str, Any]:
    """Hugging Face names → float32 tensors. llama.cpp's converter interleaves each llama query/key head's
    rotary halves (its `permute`); that is undone here. Qwen2 is converted without it."""
    import numpy as np
    import torch
    from gguf.quants import dequantize

    state = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        try:
            array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except Exception as error:
            raise ImportRefused(f"expected tensor {tensor.name} in a quantization gguf reads, got "
                                f"{tensor.tensor_type.name}: {brief(error, 160)}") from None
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if name.endswith("q_proj.weight") else config.num_key_value_heads
            array = _unpermute(array, heads)
        state[name] = torch.from_numpy(array.copy())
    return state


def _hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise ImportRefused(f"expected GGUF tensors of a plain decoder (token_embd, blk.N.attn_*, blk.N.ffn_*), got "
                        f"{name!r}, which this import does not map")


def _unpermute(weight: Any, heads: int) -> Any:
    rows = weight.shape[0]
    if rows % (2 * heads):
        raise ImportRefused(f"expected a query/key matrix of rows divisible by 2 × {heads} heads, got {weight.shape}")
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _save_model(model: Any, config: Any, state: dict[str, Any], out: Path) -> None:
    """`model` (meta, checked by `meta_model_fitting` to take exactly these shapes) filled and saved."""
    from trainer.weight_sync import save_weights

    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.tie_weights()
    config.save_pretrained(out)
    save_weights(model=model, model_dir=out)


def _gguf_tokenizer(fields: dict[str, Any], out: Path, *, chat_template: str | None) -> str:
    """Write the GGUF's byte-level BPE tokenizer as tokenizer.json + tokenizer_config.json; returns the
    pre-tokenizer's name."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    model_type = fields.get("tokenizer.ggml.model")
    if model_type != _GPT2:
        raise ImportRefused(f"expected a byte-level BPE tokenizer (tokenizer.ggml.model 'gpt2'), got {model_type!r}; "
                            "import the model's Hugging Face directory instead")
    pre = str(fields.get("tokenizer.ggml.pre") or "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    split_then_bytes = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    pre_tokenizer = {
        "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]),
        "gpt2": byte_level, "default": byte_level,
        "qwen2": pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_QWEN2_REGEX), "isolated"), *split_then_bytes]),
        "llama-bpe": pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_REGEX), "isolated"), *split_then_bytes]),
    }.get(pre)
    if pre_tokenizer is None:
        raise ImportRefused(f"expected a GGUF pre-tokenizer this import knows ({', '.join(DIGIT_GROUP)}), got "
                            f"tokenizer.ggml.pre = {pre!r}; import the model's Hugging Face directory instead")
    tokens, types = fields["tokenizer.ggml.tokens"], fields.get("tokenizer.ggml.token_type") or []
    merges = [tuple(merge.split(" ", 1)) for merge in _need(fields, "tokenizer.ggml.merges")]
    try:
        tokenizer = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges,
                                         ignore_merges=pre == "llama-bpe"))
    except Exception as error:  # a merge without its space, or of a token outside the vocabulary
        raise ImportRefused(f"expected tokenizer.ggml.merges as 'left right' pairs of tokens in the vocabulary, got "
                            f"{type(error).__name__}: {brief(error, 160)}") from None
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    control = [AddedToken(tokens[i], special=True, normalized=False) for i, kind in enumerate(types) if kind == 3]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i, kind in enumerate(types) if kind == 4]
    tokenizer.add_special_tokens(control)
    tokenizer.add_tokens(user)

    def token(key: str) -> str | None:
        index = fields.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None

    bos = token("bos")
    if fields.get("tokenizer.ggml.add_bos_token") and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokens.index(bos))])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=bos, eos_token=token("eos"),
                                      unk_token=token("unknown"), pad_token=token("padding"),
                                      model_max_length=int(fields.get(f"{fields['general.architecture']}.context_length") or 2048))
    if chat_template:
        wrapped.chat_template = chat_template
    wrapped.save_pretrained(out)
    return pre
