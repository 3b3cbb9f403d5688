"""A Bradley–Terry reward model: a causal LM's trunk plus a linear value head on the last real token.

    report = train_reward_model(pairs=pairs, model_dir=Path("base"), out_dir=Path("rm"), epochs=3, lr=1e-3)
    score(Path("rm"), "What is 2+3?", "5")           # a float; higher = preferred

Loss per pair: −log σ(R(q, o_w) − R(q, o_l)) (softplus of the negated margin, which is the same and
stable for any margin). Prompt and response are rendered with the model's chat template (a user turn
and an assistant turn), so the reward reads what the policy would have produced; a sequence longer
than `max_tokens` keeps its tail, because the pooled token is the last one and the end of a response
is what is being judged. The saved directory is the trunk (`save_pretrained`, no LM head), its
tokenizer, `value_head.safetensors` and `reward_model.json`; it is written beside `out_dir` and
renamed into place, so a crash never leaves a half-written reward model where one is expected.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from core.errors import ConfigError
from trainer.preference_pairs import PreferencePair, check_fit_options, check_out_dir, split_pairs

CONFIG_FILE = "reward_model.json"
HEAD_FILE = "value_head.safetensors"
FORMAT = "crucible-bt-reward-model/1"


class RewardModel(torch.nn.Module):
    """R(text) = w · h_last + b, h_last the trunk's final hidden state at the last non-pad token."""

    def __init__(self, trunk: PreTrainedModel) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = torch.nn.Linear(trunk.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)  # R = 0 for everything at start: the first margins are 0
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
        last = attention_mask.sum(dim=1) - 1  # (B,) right padding: the last real token's position
        pooled = hidden[torch.arange(hidden.shape[0]), last]  # (B, H)
        return self.head(pooled.float()).squeeze(-1)  # (B,)


@dataclass(frozen=True)
class RewardModelReport:
    """What training measured; `held_out_accuracy` = share of held-out pairs with R(chosen) > R(rejected)."""

    out_dir: str
    train_pairs: int
    held_out_pairs: int
    epochs: int
    steps: int
    first_train_loss: float
    last_train_loss: float
    held_out_loss: float
    held_out_accuracy: float
    seconds: float


def _render(tokenizer: PreTrainedTokenizerBase, prompt: str, response: str) -> str:
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    if tokenizer.chat_template:
        return str(tokenizer.apply_chat_template(messages, tokenize=False))
    return f"{prompt}\n{response}"  # a base model without a template reads the plain concatenation


def encode(tokenizer: PreTrainedTokenizerBase, texts: list[tuple[str, str]], *, max_tokens: int,
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T), right-padded; each sequence keeps its last `max_tokens`."""
    rows = [tokenizer(_render(tokenizer, p, r), add_special_tokens=False)["input_ids"][-max_tokens:]
            for p, r in texts]
    width = max(len(row) for row in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def pair_rewards(model: RewardModel, tokenizer: PreTrainedTokenizerBase, pairs: list[PreferencePair], *,
                 max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(R(chosen), R(rejected)), each (B,), from one forward over the 2B sequences."""
    texts = [(p.prompt, p.chosen) for p in pairs] + [(p.prompt, p.rejected) for p in pairs]
    ids, mask = encode(tokenizer, texts, max_tokens=max_tokens)
    rewards = model(ids, mask)  # (2B,)
    return rewards[: len(pairs)], rewards[len(pairs):]


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Mean of −log σ(R_w − R_l) = softplus(R_l − R_w)."""
    return torch.nn.functional.softplus(rejected - chosen).mean()


@torch.no_grad()
def evaluate(model: RewardModel, tokenizer: PreTrainedTokenizerBase, pairs: list[PreferencePair], *,
             max_tokens: int, batch_size: int) -> tuple[float, float]:
    """(mean loss, pairwise accuracy) over `pairs`; a tie counts as wrong (the model did not prefer)."""
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start: start + batch_size]
        chosen, rejected = pair_rewards(model, tokenizer, batch, max_tokens=max_tokens)
        loss_sum += float(torch.nn.functional.softplus(rejected - chosen).sum())
        correct += int((chosen > rejected).sum())
    return loss_sum / len(pairs), correct / len(pairs)


def load_base(model_dir: Path) -> tuple[RewardModel, PreTrainedTokenizerBase]:
    """A fresh reward model on the trunk of the causal LM in `model_dir` (its LM head is dropped)."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"--model: expected a model directory with config.json, got {model_dir}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # Through the causal-LM class, then its trunk: loading a causal LM's files with AutoModel works
    # too, but reports the LM head as an unexpected weight on every run.
    language_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return RewardModel(getattr(language_model, language_model.base_model_prefix)), tokenizer


def train_reward_model(
    *, pairs: list[PreferencePair], model_dir: Path, out_dir: Path, epochs: int = 3, lr: float = 1e-3,
    seed: int = 0, held_out: float = 0.2, batch_size: int = 16, max_tokens: int = 512,
) -> RewardModelReport:
    """Split (seeded), fit with AdamW for `epochs` passes over the training pairs, measure the held-out
    pairs, save to `out_dir` atomically. Same pairs, model and seed → the same split and batches."""
    out_dir = Path(out_dir)
    check_fit_options(epochs=epochs, lr=lr, batch_size=batch_size, max_tokens=max_tokens, out_dir=out_dir)
    train, held = split_pairs(pairs, held_out=held_out, seed=seed)
    started = time.monotonic()
    torch.manual_seed(seed)
    model, tokenizer = load_base(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    losses: list[float] = []
    for _ in range(epochs):
        order = list(train)
        rng.shuffle(order)
        model.train()
        for start in range(0, len(order), batch_size):
            chosen, rejected = pair_rewards(model, tokenizer, order[start: start + batch_size],
                                            max_tokens=max_tokens)
            loss = bradley_terry_loss(chosen, rejected)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
    held_loss, accuracy = evaluate(model, tokenizer, held, max_tokens=max_tokens, batch_size=batch_size)
    tail = losses[-max(1, len(losses) // 10):]
    report = RewardModelReport(
        out_dir=str(out_dir), train_pairs=len(train), held_out_pairs=len(held), epochs=epochs, steps=len(losses),
        first_train_loss=losses[0], last_train_loss=sum(tail) / len(tail), held_out_loss=held_loss,
        held_out_accuracy=accuracy, seconds=round(time.monotonic() - started, 3),
    )
    config = {"format": FORMAT, "base_model": str(Path(model_dir).resolve()), "max_tokens": max_tokens,
              "seed": seed, "lr": lr, "batch_size": batch_size, "report": asdict(report)}
    save_reward_model(model, tokenizer, out_dir=out_dir, config=config)
    return report


def save_reward_model(model: RewardModel, tokenizer: PreTrainedTokenizerBase, *, out_dir: Path,
                      config: dict[str, Any]) -> None:
    """Write everything into a temporary sibling, then rename it to `out_dir` (new or empty)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would make the renamed directory private to its writer
        model.trunk.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        save_file({k: v.detach().contiguous() for k, v in model.head.state_dict().items()}, staging / HEAD_FILE)
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        check_out_dir(out_dir)
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked): rename cannot replace a directory that has entries
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def load_reward_model(reward_model_dir: Path) -> tuple[RewardModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """A saved reward model, in eval mode, with its tokenizer and `reward_model.json`."""
    path = Path(reward_model_dir)
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        raise ConfigError(f"expected a reward model directory with {CONFIG_FILE}, got {path}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ConfigError(f"{path / CONFIG_FILE}: expected format {FORMAT!r}, "
                          f"got {config.get('format') if isinstance(config, dict) else config!r}")
    model = RewardModel(AutoModel.from_pretrained(path, dtype=torch.float32))
    model.head.load_state_dict(load_file(path / HEAD_FILE))
    return model.eval(), AutoTokenizer.from_pretrained(path), config


_loaded: dict[Path, tuple[RewardModel, PreTrainedTokenizerBase, dict[str, Any]]] = {}


@torch.no_grad()
def score(reward_model_dir: Path, prompt: str, response: str) -> float:
    """R(prompt, response) from the reward model saved at `reward_model_dir` (loaded once per process)."""
    key = Path(reward_model_dir).resolve()
    if key not in _loaded:
        _loaded[key] = load_reward_model(key)
    model, tokenizer, config = _loaded[key]
    ids, mask = encode(tokenizer, [(prompt, response)], max_tokens=int(config["max_tokens"]))
    return float(model(ids, mask)[0])
