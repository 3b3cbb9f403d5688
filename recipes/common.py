"""What every recipe shares (the demo, rl-browser, rl-mixed), in the order a recipe uses it: `settled`
(the settings' workdir, quiet libraries) → `prepare` (database, images, tiny model) →
`sft_in_two_stages` (the warm-up: an expert's demonstrations, then a sloppy expert's; `render_episode`
renders one exactly as the agent loop stores it) → `Processes` (vLLM, task worker, controller; all
stopped on exit) → the learning stages of recipes/learning.py (held-out evaluations around a train run,
`learn`).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO, TypeVar

from rich.console import Console

from cli.console import sigterm_interrupts
from core.errors import ConfigError
from recipes.model import (
    PRETRAINED_LR,
    PRETRAINED_SFT_LR,
    PRETRAINED_SLOPPY_LR,
    ModelSizing,
    checked_model_dir,
    model_sizing,
    parameter_count,
)

SFT_MICRO_BATCH_TOKENS = 4096
"""The warm-up's micro-batch at most (the tiny model's; a larger model's is its trainer's, `sized`)."""
QUIET = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "DS_ACCELERATOR": "cpu",
         "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class RecipeSettings:
    rl_minutes: float = 5.0
    rl_steps: int | None = None
    """Stop the RL phase after this many trainer steps (before the minutes run out); None: the minutes."""
    vllm_startup_s: float = 240.0
    """How long vLLM may take to answer /health (a loaded machine needs more)."""
    sft_steps: int = 1000
    seed: int = 0
    workdir: Path | None = None
    digits: tuple[int, int] = (2, 2)
    """Length range of the numbers to read."""
    train_tasks: int = 60
    test_tasks: int = 24
    group_size: int = 8
    batch_size: int = 4
    lr: float = 1e-4
    eval_samples: int = 4
    """Episodes per held-out task in each evaluation."""
    raw_eval_samples: int = 1
    """Episodes per held-out task in the evaluation of a pretrained model as imported (`learn`): before
    any warm-up it has not seen the environment's tool format, and its answers run to the token limit,
    so one episode a task says what four would at a quarter of the time."""
    episodes_at_once: int = 4
    """The task worker's concurrency: episodes played at once, so vLLM's batch (a group of 8 at once
    keeps a CPU server's batch full; each is a sandbox of the pool, at most 8)."""
    sft_lr: float = 3e-3
    sloppy_steps: int = 10
    sloppy_lr: float = 3e-4
    guess_fraction: float = 0.5
    """Share of the sloppy expert's demonstrations that guess without reading."""
    short_fraction: float = 0.8
    train_temperature: float = 1.0
    """The train run's sampling temperature (held-out evaluations sample at 1.0): above 1, groups differ
    more where the policy has settled on one choice."""
    model: Path | None = None
    """A model directory to warm up and train instead of the tiny model (recipes.model: checked, and the
    trainer's and vLLM's resources sized from it); None: the tiny model the recipe makes."""


S = TypeVar("S", bound=RecipeSettings)


def quiet() -> None:
    """QUIET in this process's environment (and so every one it starts), where not already set."""
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)


def settled(settings: S, *, name: str) -> S:
    """`quiet()`, and `settings` with its workdir defaulted to <data dir>/<name>/<timestamp>."""
    import dataclasses

    from core.settings import get_settings

    quiet()
    if settings.model is not None:
        settings = dataclasses.replace(settings, model=checked_model_dir(settings.model))
    if settings.workdir is not None:
        return settings
    return dataclasses.replace(settings, workdir=get_settings().data_dir / name / time.strftime("%Y%m%d-%H%M%S"))


def with_model(settings: S, model: Path | None) -> S:
    """`settings` training `model` (None: the tiny model, `settings` unchanged) at a pretrained model's
    learning rates (recipes.model.PRETRAINED_*)."""
    import dataclasses

    if model is None:
        return settings
    return dataclasses.replace(settings, model=checked_model_dir(model), sft_lr=PRETRAINED_SFT_LR,
                               sloppy_lr=PRETRAINED_SLOPPY_LR, lr=PRETRAINED_LR)


MODEL_HELP = ("A model directory (safetensors, tokenizer, chat template: `crucible model import`) to warm up and "
              "train instead of the tiny model; resources are sized from it.")


def model_option(value: Path | None) -> Path | None:
    """Typer callback of `--model`: the directory checked, or a usage error naming what was expected."""
    import typer

    try:
        return None if value is None else checked_model_dir(value)
    except ConfigError as error:
        raise typer.BadParameter(str(error)) from None


def policy_dir(settings: RecipeSettings, workdir: Path) -> Path:
    """The model the recipe warms up and trains: `settings.model`, or the tiny one in `workdir/tiny`."""
    return settings.model if settings.model is not None else workdir / "tiny"


def sized(settings: RecipeSettings, workdir: Path, *, max_model_len: int) -> ModelSizing:
    """Trainer and vLLM resources for the recipe's model (recipes.model.model_sizing)."""
    return model_sizing(policy_dir(settings, workdir), max_model_len=max_model_len)


def stage(console: Console, text: str) -> float:
    console.print(f"[bold cyan]▶[/] {text}")
    return time.monotonic()


def prepare(settings: RecipeSettings, *, console: Console, images: tuple[str, ...] = ("code-repo",)) -> Path:
    """Migrate the (embedded) database, build the sandbox images, make the tiny model (unless the
    settings name a model of their own)."""
    from core.db import check_database, get_engine, resolve_database_url
    from core.settings import get_settings
    from migrations import migrate

    data_dir = get_settings().data_dir
    workdir = settings.workdir or data_dir / "demo" / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    started = stage(console, f"database ({'embedded Postgres' if get_settings().uses_embedded_database else 'CRUCIBLE_DATABASE_URL'})")
    check_database(get_engine())
    migrate.upgrade("head", url=resolve_database_url())
    stage(console, f"sandbox images: crucible images build {' '.join(images)} (database ready in "
                    f"{time.monotonic() - started:.0f} s)")
    subprocess.run([sys.executable, "-m", "cli.main", "images", "build", *images], check=True)
    if settings.model is not None:
        stage(console, f"model: {settings.model} ({parameter_count(settings.model) / 1e6:.0f} M parameters)")
        return workdir
    stage(console, "tiny model: crucible model init-tiny")
    make_tiny(workdir, seed=settings.seed)
    return workdir


def make_tiny(workdir: Path, *, seed: int, stdout: TextIO | None = None) -> None:
    """The tiny model, initialised from `seed`, in `workdir/tiny` (replacing one there); what the command
    prints goes to `stdout` (None: this process's)."""
    subprocess.run([sys.executable, "-m", "cli.main", "model", "init-tiny", str(workdir / "tiny"), "--overwrite",
                    "--seed", str(seed)], check=True, stdout=stdout)


def sft_in_two_stages(
    settings: RecipeSettings, *, workdir: Path, console: Console, what: str, batch_size: int,
    demonstrations: Callable[[bool], list[tuple[list[int], list[int]]]],
) -> Path:
    """The warm-up every demo run shares: `settings.sft_steps` SFT steps on an expert's demonstrations,
    then `settings.sloppy_steps` (none: no second stage) on a sloppy one's (`demonstrations(sloppy)` makes
    each set), from the recipe's model (`policy_dir`); saves model and tokenizer to `workdir/warm`. `what`
    names both sets. Micro-batches and activation checkpointing as the trainer's (`sized`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.sft import sft_warmup

    started = stage(console, f"warm-up: {what}")
    torch.manual_seed(settings.seed)
    base = policy_dir(settings, workdir)
    sizing = sized(settings, workdir, max_model_len=1)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if sizing.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    micro_batch_tokens = min(SFT_MICRO_BATCH_TOKENS, sizing.micro_batch_tokens)
    expert = sft_warmup(model=model, steps=settings.sft_steps, lr=settings.sft_lr, batch_size=batch_size,
                        seed=settings.seed, demonstrations=demonstrations(False), micro_batch_tokens=micro_batch_tokens)
    then = ""
    if settings.sloppy_steps:
        sloppy = sft_warmup(model=model, steps=settings.sloppy_steps, lr=settings.sloppy_lr, batch_size=batch_size,
                            seed=settings.seed + 1, demonstrations=demonstrations(True),
                            micro_batch_tokens=micro_batch_tokens)
        then = f", then {sloppy.last_loss:.3f} (sloppy)"
    out = workdir / "warm"
    model.save_pretrained(out)
    tokenizers(base)[0].save_pretrained(out)
    console.print(f"  loss {expert.first_loss:.2f} → {expert.last_loss:.4f}{then} in {time.monotonic() - started:.0f} s")
    return out


def register(spec: dict[str, Any], tasks: tuple[list[Any], list[Any]]) -> dict[str, int]:
    """Register `spec` and upsert its (train, test) read_number tasks (idempotent); how many of each."""
    from core.db import session_scope
    from environments.read_number.task import insert_tasks
    from environments.service import register_environment
    from environments.spec import parse_spec

    train, test = tasks
    with session_scope() as session:
        register_environment(session, spec=parse_spec(spec))
        insert_tasks(session, environment=spec["name"], tasks=train + test)
    return {"train": len(train), "test": len(test)}


_TOKENIZERS: dict[Path, Any] = {}


def tokenizers(path: Path) -> Any:
    """The model's tokenizer, and the worker's two tokenize functions over it (chat frame, plain text)."""
    from transformers import AutoTokenizer

    from task_workers.policy.client import local_tokenizers

    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = (AutoTokenizer.from_pretrained(path), local_tokenizers(str(path)))
    return _TOKENIZERS[path]


def render_episode(
    *, tokenizer_dir: Path, system_prompt: str, tools: list[dict[str, Any]], opening: str,
    turns: list[tuple[dict[str, Any], str | None]], short: bool, sampled: list[list[int]] | None = None,
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of an episode exactly as the agent loop stores it: the chat template's
    prompt (system + tools + the opening user message; `short`: the opening alone), each tool call
    closed by the template's end of turn (mask 1), each observation in the loop's frame (mask 0; None:
    the call ended the episode). `sampled`: the tokens a policy sampled for each action, in place of
    the call's canonical (Hermes) rendering."""
    from core.renderers import renderer_for
    from environments.read_number.demos import tool_call_text

    tokenizer, (chat, plain) = tokenizers(tokenizer_dir)
    renderer = renderer_for(tokenizer.chat_template)
    messages = [{"role": "user", "content": opening}]
    if not short:
        messages.insert(0, {"role": "system", "content": system_prompt})
    ids = list(tokenizer.apply_chat_template(messages, tools=None if short else tools, add_generation_prompt=True,
                                             return_dict=False))
    mask = [0] * len(ids)
    for index, (call, observation) in enumerate(turns):
        action = sampled[index] if sampled is not None else \
            chat(tool_call_text(call["name"], call["arguments"]) + renderer.end_of_turn[0])
        ids += action
        mask += [1] * len(action)
        if observation is not None:
            frame = renderer.frame(observation, completion_closed=True, turn=index)
            seen = chat(frame.before) + plain(frame.text) + chat(frame.after)
            ids += seen
            mask += [0] * len(seen)
    return ids, mask


def _die_with_parent() -> None:
    """In a child before exec: SIGTERM it when the demo dies, even by SIGKILL (`__exit__` never runs
    then, and a worker, controller or trainer left behind would keep a machine busy for nothing)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


@dataclass
class Processes:
    """vLLM, one task worker and the controller, started in that order and always stopped."""

    workdir: Path
    served_dir: Path
    console: Console
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    server: Any = None
    startup_timeout_s: float = 240.0
    max_model_len: int = 1024
    queues: str = "celery,read_number"
    """The worker's Celery queues: an environment's episodes go to the queue named after its kind."""
    sizing: ModelSizing | None = None
    """vLLM's dtype, KV cache and cores, and the trainer's config (recipes.model); None: the defaults
    (float32, 1 GiB, vLLM's own cores)."""
    serving: str = "the warmed-up model"
    """What vLLM serves, in the words its stage prints."""
    episodes_at_once: int = 4
    """The worker's concurrency (RecipeSettings.episodes_at_once)."""
    _sigterm: Any = None

    def __enter__(self) -> Processes:
        # SIGTERM is Ctrl-C here: Python's default would end this process at once, and vLLM (in its own
        # process group, for stop() to reach its engine processes) would outlive it.
        self._sigterm = sigterm_interrupts()
        self._sigterm.__enter__()
        try:
            return self._start()
        except BaseException:  # Ctrl-C while starting: stop what started (__exit__ does not run then)
            self.__exit__(None, None, None)
            raise

    def _start(self) -> Processes:
        from trainer.serving import VllmServer

        sizing = self.sizing
        started = stage(self.console, f"vLLM on CPU serving {self.serving}" +
                        (f" ({sizing.served_dtype}, {sizing.kv_cache_gib} GiB KV cache)" if sizing else ""))
        self.server = VllmServer(model_dir=self.served_dir, served_model_name="policy",
                                 max_model_len=self.max_model_len, log_path=self.workdir / "logs" / "vllm.log",
                                 startup_timeout_s=self.startup_timeout_s,
                                 dtype=sizing.served_dtype if sizing else "float32",
                                 kv_cache_gib=sizing.kv_cache_gib if sizing else 1,
                                 cpus=sizing.serving_cores if sizing else None)
        self.server.start()
        self.console.print(f"  {self.server.api_url} healthy after {time.monotonic() - started:.0f} s")
        env = {"CRUCIBLE_POLICY_URL": self.server.api_url, "CRUCIBLE_POLICY_TOKENIZER": str(self.served_dir),
               "CRUCIBLE_WORKER_CONCURRENCY": str(self.episodes_at_once),
               "CRUCIBLE_SANDBOX_POOL_MIN": str(min(self.episodes_at_once, 8)), "CRUCIBLE_SANDBOX_POOL_MAX": "8"}
        self.spawn("worker", [sys.executable, "-m", "cli.main", "worker", "-Q", self.queues], env)
        self.spawn("controller", [sys.executable, "-m", "cli.main", "controller", "--poll", "0.5"], env)
        return self

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.workdir / "logs" / f"{name}.log").open("ab")
        self.children[name] = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True,
                                               preexec_fn=_die_with_parent)
        self.console.print(f"  started {name} (pid {self.children[name].pid}, log {log.name})")

    def check_alive(self) -> None:
        for name, child in self.children.items():
            if child.poll() is not None and name != "trainer":
                raise RuntimeError(f"{name} exited with {child.returncode}; see {self.workdir}/logs/{name}.log")

    def stop(self, name: str, *, grace_s: float = 60.0) -> int | None:
        child = self.children.pop(name, None)
        if child is None:
            return None
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        return child.returncode

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            for name in ("trainer", "controller", "worker", *self.children):  # then any other (a reward model)
                self.stop(name)
        finally:
            if self.server is not None:
                self.server.stop()
            if self._sigterm is not None:
                self._sigterm.__exit__(None, None, None)
                self._sigterm = None


Recipe = TypeVar("Recipe", bound=Callable[..., dict[str, Any]])


def says_what_stays_running(recipe: Recipe) -> Recipe:
    """A recipe (the demo, rl-browser, rl-mixed: `recipe(settings, console=…)`) that says, when it ends
    or is interrupted, what it leaves running on purpose: only the embedded Postgres, for the dashboard."""

    @functools.wraps(recipe)
    def run(*args: Any, console: Console, **kwargs: Any) -> dict[str, Any]:
        from core.settings import get_settings

        try:
            return recipe(*args, console=console, **kwargs)
        finally:
            if get_settings().uses_embedded_database:
                console.print("  The embedded Postgres keeps running so that `crucible api` and the dashboard can "
                              "show the runs; `crucible db stop` stops it (vLLM, the worker, the controller and "
                              "the trainer have stopped).")

    return run  # type: ignore[return-value]
