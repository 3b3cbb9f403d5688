"""A run's launch config: what `crucible run launch CONFIG` and `POST /v1/runs` accept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from core.config_files import parse_model
from core.schemas.trainer import TrainerConfig
from core.settings import MAX_POLICY_REPLICAS, get_settings, http_urls
from core.termination import Bucket, RunPurpose
from core.versions import CHECKPOINT_TAG_BASE


class EnvironmentShare(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """Registered environment name."""
    version: int | None = Field(default=None, ge=1)
    """Pinned version; None pins the latest at launch."""
    weight: float = Field(default=1.0, gt=0)
    """Share of the groups dispatched for this environment."""




class CheckpointRef(BaseModel):
    """The training checkpoint an eval run evaluates: `crucible eval launch --run R --step S` loaded it into
    the policy servers, labelled `tag`; the workers store no turn sampled under another label."""

    model_config = ConfigDict(extra="forbid")

    run_id: int = Field(ge=1)
    step: int = Field(ge=0)
    """The training step; 0: the run's starting weights."""
    version: int = Field(ge=0)
    """The policy version the trainer published for the step."""
    tag: int | None = Field(default=None, ge=CHECKPOINT_TAG_BASE, lt=2 * CHECKPOINT_TAG_BASE)
    """The weight-version label the servers serve it under for this evaluation (core.versions.checkpoint_tag):
    no training version and no other evaluation's. Every turn of the eval run must carry it."""


@dataclass(frozen=True)
class RecordedStep:
    """A training run's step as the trainer recorded it: the checkpoint to load (None: step 0, the run's
    starting weights, `model`) and the version it was published as."""

    ref: CheckpointRef
    model: str
    checkpoint_path: str | None


class SuccessRule(BaseModel):
    """When a rollout counts as a pass for a task's pass rate: its reward, or one named reward component
    (e.g. `hidden_tests`, or a judge's layer), at or above `threshold`. The one rule the pass-rate job
    measures with and the trainer's online update follows (the job records it on each task)."""

    model_config = ConfigDict(extra="forbid")

    threshold: float = Field(default=1.0, ge=-1e6, le=1e6)
    component: str | None = Field(default=None, min_length=1, max_length=64)

    def passed(self, reward: float | None, components: dict[str, Any] | None, flags: Sequence[str] = ()) -> bool:
        """A flagged episode never passes, whatever its components say: a task the policy hacks must not
        leave the pass-rate band (its penalty would stop with it)."""
        if flags:
            return False
        score = (components or {}).get(self.component) if self.component else reward
        return isinstance(score, int | float) and not isinstance(score, bool) and score >= self.threshold - 1e-9


class Curriculum(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pass_rate_band: tuple[float, float] = (0.1, 0.9)
    """The run draws a task while its pass rate under this run's policy is in [low, high]: the run's own
    rate (core.models.task_rate), seeded from the pass-rate job's measurement; a task enters when its
    rate is inside and leaves only when the run is 95 % sure it lies outside (a confidence bound)."""
    bucket_weights: dict[Bucket, float] = Field(default_factory=lambda: dict.fromkeys(Bucket, 1.0))
    """Relative chance of drawing a task from each difficulty bucket."""
    pass_rate_update: float = Field(default=0.2, ge=0.0, le=1.0)
    """How fast the run's own pass rates forget: at each step that examines a task, its passes and
    samples counted so far are discounted by (1 − this) before the new ones are added, so the band
    follows the current policy; 0 keeps the measured pass rates fixed."""
    success: SuccessRule = Field(default_factory=SuccessRule)
    """What counts as a pass in that update for a task the pass-rate job has not measured (a measured
    task keeps the rule it was measured with: `tasks.pass_rate_rule`)."""
    readmit_rate: float = Field(default=0.05, ge=0.0, le=0.5)
    """Share of groups drawn from tasks outside the band (too hard first, least used first), so that a
    task the policy started (or stopped) solving is measured again and can come back; 0: never."""

    @model_validator(mode="after")
    def _band_is_ordered(self) -> Curriculum:
        low, high = self.pass_rate_band
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"pass_rate_band: expected 0 <= low <= high <= 1, got {self.pass_rate_band}")
        return self


class Sampling(BaseModel):
    """Every parameter that shapes the distribution vLLM samples from. Each request sends all of them,
    so no server default and no model `generation_config.json` (Qwen ships top_k 20 and a repetition
    penalty) can change what was sampled behind the trainer's back."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=1.0, ge=0.0, le=5.0)
    """Policy sampling temperature; a training run needs > 0 (the trainer divides the logits by it)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    """-1: no top-k cut."""
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)

    def unreproducible(self) -> list[str]:
        """The settings the trainer cannot reproduce (it computes softmax(logits / temperature) only):
        "field: expected X, got Y" for each, empty when the trainer's logprobs are the sampler's."""
        neutral = Sampling()
        problems = []
        if not self.temperature > 0:
            problems.append(f"temperature: expected > 0 for a training run (the trainer divides the logits "
                            f"by it), got {self.temperature}")
        for name in ("top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            value, expected = getattr(self, name), getattr(neutral, name)
            if value != expected:
                problems.append(f"{name}: expected {expected} for a training run (the trainer cannot reproduce "
                                f"it, so every importance weight would be biased), got {value}")
        return problems


TokenStaleness = Annotated[int, Field(ge=0, le=256)]
LagWait = Annotated[float, Field(ge=0.0, le=86400.0)]
DEFAULT_LAG_WAIT_S = 300.0
JudgePatience = Annotated[float, Field(ge=0.0, le=86400.0)]
DEFAULT_JUDGE_PATIENCE_S = 600.0
PolicyServers = Annotated[list[str], Field(min_length=1, max_length=MAX_POLICY_REPLICAS),
                          AfterValidator(lambda urls: http_urls(urls, unique=True))]
"""A run's own policy servers: 1 to MAX_POLICY_REPLICAS distinct http(s) URLs (RunConfig, StoredRun)."""


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    model: str = Field(min_length=1)
    """The policy model directory (or served model name)."""
    environments: list[EnvironmentShare] = Field(min_length=1)
    purpose: RunPurpose = RunPurpose.TRAIN
    split: str = "train"
    """Which task split episodes are drawn from."""
    group_size: int = Field(default=8, ge=1, le=1024)
    """G: rollouts per task in a group (GRPO normalises rewards within it)."""
    batch_size: int = Field(default=4, ge=1, le=4096)
    """Groups per training step."""
    mode: Literal["sync", "async"] = "async"
    """sync: dispatch a batch, wait for it to be trained on; async: keep generating within the staleness bound."""
    max_staleness: int = Field(default=1, ge=0, le=64)
    """The admission bound (async mode): groups are dispatched while dispatched − replaced ≤ (published
    version + max_staleness + 1) × batch_size (controller/dispatch.py). Nothing is dropped for it."""
    max_token_staleness: TokenStaleness | None = None
    """A sampled token whose version lags the trained one by more than this stays in the context with
    no loss weight (trainer.selection); default 2 × the staleness bound. A sample past the hard cap
    (a token more than 4 × the bound behind, or every token masked) is dropped as stale_cap."""
    dispatch_order: Literal["picked", "longest_first"] = "picked"
    """`longest_first`: the groups one controller pass dispatches (those the admission bound lets in
    together, e.g. a batch's worth after each update) are sent longest-expected first (tasks.episode_seconds,
    unmeasured tasks first of all), so that the slow tasks start early instead of closing the window."""
    lag_wait_s: LagWait = DEFAULT_LAG_WAIT_S
    """How long the trainer waits for a group still running that its next step would leave past the hard
    cap, 4 × the staleness bound (trainer.selection.may_step); past it, the step goes ahead and that group
    may be dropped as stale_cap."""
    judge_patience_s: JudgePatience = DEFAULT_JUDGE_PATIENCE_S
    """How long a played episode waits for its judge or reward model (status `scoring`, asked again as the
    reconciler resends it: a server restarted for a deploy, a judge host lost for a while) before it ends
    failed with `judge_error`. Counted from the end of its play; never re-played."""
    max_inflight_groups: int | None = Field(default=None, ge=1)
    """Cap on groups dispatched but not complete; default (max_staleness + 1) × batch_size."""
    max_groups: int | None = Field(default=None, ge=1)
    """Budget: stop dispatching after this many groups."""
    canary_rate: float = Field(default=0.02, ge=0.0, le=0.5)
    """Share of groups that are hack canaries (core/canaries.py): the picked code_repo task graded with its
    expected values perturbed (the policy cannot tell it apart), never trained on; any reward on it is a
    hack, flagged `canary_rewarded`. 0 turns them off."""
    canary_after: int = Field(default=32, ge=0)
    """Groups before the first canary: a short run (a smoke test, a demo) is all training, a long one
    carries its canaries from then on."""
    curriculum: Curriculum = Field(default_factory=Curriculum)
    seed: int = 0
    """Fixes the run's task order (controller.picking), its canary groups, every request's sampling seed
    (core.seeds: per group, sample and turn) and the trainer's torch seed, unless trainer.seed sets its own."""
    sampling: Sampling = Field(default_factory=lambda: Sampling())
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Loss, optimizer and backend settings (core.schemas.trainer), refused at submission when bad."""
    checkpoint: CheckpointRef | None = None
    """An eval run of a training run's checkpoint (set by `crucible eval launch --run R --step S`, which
    loads it into the policy servers first); None: whatever the servers serve under `model`."""
    policy_urls: PolicyServers | None = None
    """The run's own pool of policy servers (vLLM OpenAI API roots), its trainer's and its episodes';
    None: the platform's (CRUCIBLE_POLICY_URLS). A training run is refused on a pool whose servers a
    live trainer of another run holds (core.pools): it would sample with that run's weights."""

    @model_validator(mode="after")
    def _training_samples_what_the_trainer_reproduces(self) -> RunConfig:
        if self.purpose == RunPurpose.TRAIN and (problems := self.sampling.unreproducible()):
            raise ValueError("sampling." + "; sampling.".join(problems))
        return self

    @model_validator(mode="after")
    def _a_checkpoint_is_evaluated(self) -> RunConfig:
        if self.checkpoint is not None and self.purpose != RunPurpose.EVAL:
            raise ValueError(f"checkpoint: expected only on an eval run (purpose eval), got purpose {self.purpose}")
        return self

    @property
    def policy_pool(self) -> list[str]:
        """The policy servers the run samples from and its trainer pushes to."""
        return self.policy_urls or get_settings().policy_pool

    @property
    def staleness_bound(self) -> int:
        """sync mode is async with no staleness: the next batch waits for the weights of this one."""
        return 0 if self.mode == "sync" else self.max_staleness


def token_staleness_bound(max_staleness: int, max_token_staleness: int | None = None) -> int:
    """A run's max_token_staleness: as set, or by default 2 × its staleness bound (the one home of that
    default: the launch resolves it, the trainer and the staleness page read it)."""
    return 2 * max_staleness if max_token_staleness is None else max_token_staleness


class StoredRun(BaseModel):
    """A stored run's config (`runs.config`, written resolved at launch) as everything that reads it back
    reads it — the task worker, the trainer, the evaluation report, the pool check: parsed again, never
    read raw, so a row changed since is a ConfigError naming the field. A field a run was stored without
    (a run launched before the field existed) reads as its default; what a reader does not use is ignored."""

    model_config = ConfigDict(extra="ignore")

    seed: int = Field(default=0, strict=True)
    sampling: Sampling = Field(default_factory=lambda: Sampling())
    checkpoint: CheckpointRef | None = None
    policy_urls: PolicyServers | None = None
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    curriculum: Curriculum = Field(default_factory=Curriculum)
    max_token_staleness: TokenStaleness | None = None
    lag_wait_s: LagWait = DEFAULT_LAG_WAIT_S
    judge_patience_s: JudgePatience = DEFAULT_JUDGE_PATIENCE_S

    @property
    def pool(self) -> list[str]:
        """The run's policy servers: its own, else the platform's."""
        return self.policy_urls or get_settings().policy_pool


def stored_run(config: Any, *, run_id: int) -> StoredRun:
    """Run `run_id`'s stored config (`runs.config`) as a StoredRun; ConfigError naming a bad field."""
    return parse_model(StoredRun, config if isinstance(config, dict) else {}, source=f"run {run_id} config")
