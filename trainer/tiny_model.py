"""Tiny Qwen2-architecture causal LMs with a locally trained tokenizer, for tests and the demo.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on `tiny_corpus`, the weights are
random from `seed`. Same seed and spec → byte-identical files.

    crucible model init-tiny /tmp/tiny --seed 0
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from core.errors import ConfigError
from trainer.chat_template import CHAT_TEMPLATE
from trainer.tiny_corpus import corpus

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Added but not "special": decoding with skip_special_tokens (vLLM's default) must keep them, or
# the tool-call framing vanishes from the text (Qwen2.5 marks them the same way).
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]
# transformers' Qwen2Tokenizer.PRETOKENIZE_REGEX (copied: that module is private to transformers).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
MIN_HEAD_DIM = 32  # vLLM's CPU attention rejects head_dim 16 ("Unsupported CPU attention configuration")


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny model. Defaults: ~0.8 M parameters, 3.4 MB of float32 safetensors."""

    hidden: int = 128
    """Hidden size; `hidden / heads` is the head dim and must be at least 32."""
    layers: int = 2
    """Decoder layers."""
    heads: int = 4
    """Query heads."""
    kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide `heads`."""
    intermediate: int = 256
    """MLP width."""
    vocab_size: int = 2048
    """Target tokenizer vocabulary, special tokens included; the model's vocab is the tokenizer's."""
    max_position: int = 4096
    """Longest sequence (rotary positions); serve with `--max-model-len` at most this."""
    init_std: float = 0.02
    """Std of the normal weight init (Hugging Face's `initializer_range`)."""
    tied: bool = False
    """Tie the output layer to the token embeddings, as most small pretrained chat models do (Qwen2.5-0.5B,
    SmolLM2): one matrix trained, pushed and probed as both."""

    def check(self) -> None:
        """Raise ConfigError naming the first option vLLM or Qwen2 cannot use."""
        if self.hidden % self.heads:
            raise ConfigError(f"expected --hidden divisible by --heads, got {self.hidden} and {self.heads}")
        if self.hidden // self.heads < MIN_HEAD_DIM:
            raise ConfigError(
                f"expected a head dim (hidden / heads) of at least {MIN_HEAD_DIM} (vLLM CPU attention), "
                f"got {self.hidden} / {self.heads} = {self.hidden // self.heads}"
            )
        if self.heads % self.kv_heads:
            raise ConfigError(f"expected --kv-heads to divide --heads, got {self.kv_heads} and {self.heads}")
        if not 512 <= self.vocab_size <= 32768:
            raise ConfigError(f"expected --vocab-size between 512 and 32768, got {self.vocab_size}")
        if min(self.layers, self.intermediate, self.max_position) < 1 or self.init_std <= 0:
            raise ConfigError(f"expected positive sizes and init std, got {self}")


@dataclass(frozen=True)
class TinyModelInfo:
    """What `make_tiny_model` wrote."""

    path: Path
    parameters: int
    vocab_size: int
    weight_bytes: int


def train_tokenizer(*, vocab_size: int, max_length: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE over the built-in corpus, with ChatML specials and the chat template."""
    bpe = Tokenizer(models.BPE())  # byte-level: every byte has a token, so no unknown token
    # Qwen2's exact pipeline: `AutoTokenizer` loads this as `Qwen2Tokenizer`, which rebuilds the
    # normalizer and pre-tokenizer from its own code; training with the same ones keeps ids identical.
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(SPECIAL_TOKENS)  # before training, so the corpus' ChatML markers stay whole
    bpe.add_tokens([AddedToken(token, special=False, normalized=False) for token in TOOL_TOKENS])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,  # ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=max_length,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,  # decode(encode(text)) must give text back exactly
    )


def build_model(*, spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen2ForCausalLM:
    """Random float32 weights from `seed`; the global torch RNG is left as it was."""
    vocab = tokenizer.get_vocab()
    im_end, endoftext = vocab[IM_END], vocab[ENDOFTEXT]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_position,
        initializer_range=spec.init_std,
        tie_word_embeddings=spec.tied,  # a tied head reaches vLLM too: trainer.weight_sync.save_weights
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        dtype="float32",  # the server runs float32 too, so trainer and vLLM logprobs agree to ~1e-6
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, endoftext], pad_token_id=endoftext, bos_token_id=endoftext
    )
    return model.eval()


def make_tiny_model(
    *, out_dir: Path, seed: int = 0, spec: TinyModelSpec | None = None, overwrite: bool = False
) -> TinyModelInfo:
    """Write model, tokenizer and chat template to `out_dir` with `save_pretrained` (safetensors)."""
    spec = spec or TinyModelSpec()
    spec.check()
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise ConfigError(f"expected an empty or new directory, got {out_dir} with files in it")
    tokenizer = train_tokenizer(vocab_size=spec.vocab_size, max_length=spec.max_position)
    model = build_model(spec=spec, tokenizer=tokenizer, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "crucible_tiny.json").write_text(json.dumps({"seed": seed, **asdict(spec)}, indent=2) + "\n")
    return TinyModelInfo(
        path=out_dir,
        parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=len(tokenizer),
        weight_bytes=sum(f.stat().st_size for f in out_dir.glob("*.safetensors")),
    )
