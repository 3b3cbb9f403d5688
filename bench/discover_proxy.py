"""The discover recipe's learning loop offline, to choose what to run for real: `recipes.discover`'s
warm-up, then a held-out evaluation, on-policy GRPO steps and a held-out evaluation again, all in this
process: HF sampling against the recipe's `Workspace` (what the sandbox prints for `ls` and `cat`), no
vLLM, sandbox, worker or database. About 10 minutes a seed on these machines, against 25 to 29 for
`bench/learning.py --recipe discover`.

    .venv/bin/python bench/discover_proxy.py                              # seeds 0 1 2, the recipe's settings
    .venv/bin/python bench/discover_proxy.py --seeds 2 --sft-steps 1600 --rl-steps 30

Prints one JSON object: per seed, the held-out figures before RL, every 10 steps and after (`Figures`:
success, how often the first `cat` reads the listed file, and the copy rate: of the episodes that read
the task's file, the share that submit what it printed), the train success of each step, and the
minutes. The copy rate is what the real pipeline does not show, and what decided the recipe's warm-up
length (docs/training/learning.md#discover).

What it leaves out, so its numbers are the proxy's and never the platform's: RL is on-policy and
synchronous (no staleness, no vLLM), a step takes the first `batch_size` groups with a reward spread
(the trainer's drop of groups without one, not its queue), a call that cannot be parsed or names a
tool other than `bash` and `submit` ends the episode with reward 0 (the runner would answer it with an
error, up to `max_tool_errors`), and a command other than `ls` or `cat NAME` prints nothing. What it shares with the platform: the warm-up, the tasks, the
prompt, the tool-call parser, the verifier, the advantages (`trainer.advantages`), the loss
(`trainer.loss.policy_loss`) and the optimizer's settings (`OptimizerConfig`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from recipes.common import quiet
from recipes.discover import ENV_SPEC, SETTINGS, DiscoverSettings, Workspace, reads_listed, tasks, warm_up

EVAL_EVERY = 10


@dataclasses.dataclass
class Episode:
    task: Any
    """A read_number task (`NewTask`)."""
    ids: list[int]
    spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    """[start, end) of each action's tokens in `ids`."""
    turns: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """Each bash turn's command and what it printed (as `recipes.discover.reads_listed` takes them)."""
    answer: str | None = None
    reward: float = 0.0
    done: bool = False

    def loss_mask(self) -> list[int]:
        """1 on the tokens the policy sampled."""
        sampled = {t for start, end in self.spans for t in range(start, end)}
        return [int(t in sampled) for t in range(len(self.ids))]


@dataclasses.dataclass(frozen=True)
class Figures:
    episodes: int
    success: float
    reads_listed: float
    copy: float | None
    """Of the episodes that `cat` the task's file, the share that submit what it printed; None: none did."""

    @classmethod
    def of(cls, episodes: list[Episode]) -> Figures:
        right = [e for e in episodes if any(command.split() == ["cat", e.task.payload.path] for command, _ in e.turns)]
        copied = sum(e.answer is not None and e.answer.strip() == e.task.payload.number for e in right)
        return cls(episodes=len(episodes), success=round(statistics.fmean(e.reward for e in episodes), 3),
                   reads_listed=round(statistics.fmean(reads_listed(e.turns) for e in episodes), 3),
                   copy=round(copied / len(right), 3) if right else None)


class Player:
    """The policy (a causal LM) playing episodes of the recipe's environment, a batch of them at a time."""

    def __init__(self, model_dir: Path, settings: DiscoverSettings) -> None:
        from transformers import AutoModelForCausalLM

        from environments.read_number.kind import ReadNumberKind
        from environments.spec import parse_spec
        from recipes.common import tokenizers

        self.settings = settings
        self.kind = ReadNumberKind(parse_spec(ENV_SPEC))
        self.limits = self.kind.spec.limits
        self.tokenizer, (self.chat, self.plain) = tokenizers(model_dir)
        self.model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
        [self.end] = self.chat("<|im_end|>")
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end
        self._prompts: dict[str, list[int]] = {}

    def prompt(self, instruction: str) -> list[int]:
        """The episode's first tokens, as task_workers.episode.loop.initial_prompt renders them."""
        if instruction not in self._prompts:
            messages = [{"role": "system", "content": self.kind.system_prompt()}, {"role": "user", "content": instruction}]
            self._prompts[instruction] = list(self.tokenizer.apply_chat_template(
                messages, tools=self.kind.tools(), add_generation_prompt=True, return_dict=False))
        return self._prompts[instruction]

    @torch.no_grad()
    def _sample(self, contexts: list[list[int]], temperature: float) -> list[list[int]]:
        self.model.eval()
        width = max(map(len, contexts))
        ids = torch.tensor([[self.pad] * (width - len(c)) + c for c in contexts])
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature,
                                  top_k=0, top_p=1.0, max_new_tokens=self.limits.max_response_tokens,
                                  eos_token_id=self.end, pad_token_id=self.pad)
        return [row[:row.index(self.end) + 1] if self.end in row else row for row in out[:, width:].tolist()]

    def play(self, batch: list[Any], *, temperature: float = 1.0) -> list[Episode]:
        """One episode per task of `batch` (a task may repeat), every one to its end or `max_turns`."""
        from core.renderers import CHATML
        from environments.parsing import MalformedToolCall, parse_hermes
        from environments.rewards import total

        episodes = [Episode(task=task, ids=list(self.prompt(task.instruction))) for task in batch]
        for _ in range(self.limits.max_turns):
            live = [e for e in episodes if not e.done]
            if not live:
                break
            for episode, action in zip(live, self._sample([e.ids for e in live], temperature), strict=True):
                episode.spans.append((len(episode.ids), len(episode.ids) + len(action)))
                episode.ids += action
                try:
                    call = parse_hermes(self.tokenizer.decode(action))
                except MalformedToolCall:
                    call = None
                if call is None or call.name not in ("bash", "submit"):
                    episode.done = True
                    continue
                if call.name == "submit":
                    verdict = self.kind.verify(sandbox=None, task=episode.task.payload, submitted=True,  # type: ignore[arg-type]
                                               open_sandbox=None, actions=[call])  # type: ignore[arg-type]
                    value = call.arguments.get("answer")
                    episode.answer = value if isinstance(value, str) else json.dumps(value)
                    episode.reward, episode.done = total(verdict.layers, verdict.flags, self.kind.spec).value, True
                    continue
                command = str(call.arguments.get("command", ""))
                payload = episode.task.payload
                printed = Workspace({payload.path: payload.number}).run(command) or ""
                episode.turns.append((command.strip(), printed))
                closed = action[-1:] == [self.end]
                frame = CHATML.frame(printed, completion_closed=closed, turn=len(episode.turns) - 1)
                episode.ids += self.chat(frame.before) + self.plain(frame.text) + self.chat(frame.after)
        return episodes

    def evaluate(self, test: list[Any]) -> Figures:
        return Figures.of(self.play([task for task in test for _ in range(self.settings.eval_samples)]))


def grpo_step(player: Player, groups: list[list[Episode]], optimizer: torch.optim.Optimizer) -> None:
    """One on-policy update: the trainer's advantages and loss over `groups` (π_prox = π_behav = π_θ)."""
    from core.schemas.trainer import LossConfig, OptimizerConfig
    from trainer.advantages import assign_advantages
    from trainer.loss import TokenTensors, policy_loss
    from trainer.rollouts import Group, Sample

    loss_config = LossConfig()
    batch = [Group(id=g, group_index=g, environment=ENV_SPEC["name"], policy_version=0, samples=[
        Sample(episode_id=i, group_id=g, environment=ENV_SPEC["name"], status="completed", termination=None,
               reward=e.reward, components={}, policy_version=0, token_ids=e.ids, loss_mask=e.loss_mask(),
               behaviour_logprobs=[0.0] * len(e.ids), score=e.reward) for i, e in enumerate(group)])
             for g, group in enumerate(groups)]
    assign_advantages(batch, scale_by_std=loss_config.scale_advantages_by_std)
    total = sum(end - start for group in groups for e in group for start, end in e.spans)
    player.model.train()
    optimizer.zero_grad()
    for group, scored in zip(groups, batch, strict=True):
        for episode, sample in zip(group, scored.samples, strict=True):
            ids = torch.tensor([episode.ids])
            logits = player.model(input_ids=ids).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(2, ids[:, 1:, None])[..., 0]
            mask = torch.tensor([sample.loss_mask[1:]], dtype=logp.dtype)  # position t scores token t + 1
            tokens = TokenTensors(logp=logp, prox_logp=logp.detach(), behav_logp=logp.detach(),
                                  advantages=torch.full_like(logp, sample.advantage), mask=mask)
            loss, _ = policy_loss(tokens, total_tokens=total, loss=loss_config)
            loss.backward()
    torch.nn.utils.clip_grad_norm_(player.model.parameters(), OptimizerConfig().max_grad_norm)
    optimizer.step()


def run_seed(settings: DiscoverSettings, *, rl_steps: int) -> dict[str, Any]:
    """The warm-up (in `settings.workdir`), then held-out figures before, during and after `rl_steps` steps."""
    from rich.console import Console

    from core.schemas.trainer import OptimizerConfig
    from recipes.common import make_tiny

    began = time.monotonic()
    assert settings.workdir is not None
    make_tiny(settings.workdir, seed=settings.seed, stdout=sys.stderr)  # stdout carries the JSON alone
    warm = warm_up(settings, workdir=settings.workdir, console=Console(stderr=True))
    torch.manual_seed(settings.seed)
    train, test = tasks(settings)
    player = Player(warm, settings)
    optimizer_config = OptimizerConfig()
    optimizer = torch.optim.AdamW(player.model.parameters(), lr=settings.lr, betas=optimizer_config.betas,
                                  weight_decay=optimizer_config.weight_decay)
    result: dict[str, Any] = {"seed": settings.seed, "before": dataclasses.asdict(player.evaluate(test)),
                              "steps": []}
    rng = random.Random(f"discover-proxy:{settings.seed}")
    order: list[Any] = []
    for step in range(1, rl_steps + 1):
        groups: list[list[Episode]] = []
        played: list[Episode] = []
        while len(groups) < settings.batch_size and len(played) < 6 * settings.batch_size * settings.group_size:
            if not order:
                order = rng.sample(train, len(train))
            task = order.pop()
            group = player.play([task] * settings.group_size, temperature=settings.train_temperature)
            played += group
            if len({e.reward for e in group}) > 1:
                groups.append(group)
        row: dict[str, Any] = {"step": step, "train_success": Figures.of(played).success, "groups": len(groups)}
        if groups:
            grpo_step(player, groups, optimizer)
        if step % EVAL_EVERY == 0 and step < rl_steps:
            row["held_out"] = dataclasses.asdict(player.evaluate(test))
        result["steps"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    result["after"] = dataclasses.asdict(player.evaluate(test))
    result["minutes"] = round((time.monotonic() - began) / 60, 1)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sft-steps", type=int, default=SETTINGS.sft_steps)
    parser.add_argument("--rl-steps", type=int, default=30,
                        help="GRPO steps (30: about what the real pipeline makes in its 14 minutes)")
    parser.add_argument("--lr", type=float, default=SETTINGS.lr)
    parser.add_argument("--workdir", type=Path, default=None, help="Default: a temporary directory, removed after.")
    args = parser.parse_args(argv)
    quiet()  # before DeepSpeed, which the trainer's modules import, would print to stdout
    with tempfile.TemporaryDirectory(prefix="discover-proxy-") as scratch:
        root = args.workdir or Path(scratch)
        per_seed = [run_seed(dataclasses.replace(SETTINGS, seed=seed, sft_steps=args.sft_steps, lr=args.lr,
                                                 workdir=root / f"seed-{seed}"), rl_steps=args.rl_steps)
                    for seed in args.seeds]
    out = {"bench": "discover_proxy", "sft_steps": args.sft_steps, "rl_steps": args.rl_steps, "lr": args.lr,
           "seeds": per_seed}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
