"""Environment specs: what a user registers (YAML or JSON) and a run pins by version.

    name: fix-python-bugs
    kind: code_repo
    image: code-repo            # an image under environments/images/, or any local image tag
    sandbox: {cpus: 1, memory: 1g, pids: 256}
    limits: {max_turns: 20, max_context_tokens: 8192, max_response_tokens: 512, episode_timeout_s: 600}
    verifier: {weights: {format: 0.1, public_tests: 0.2, hidden_tests: 0.7}}
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from core.config_files import load_model_file, parse_model
from core.errors import ConfigError
from core.schemas.sandbox import SandboxSpec, describe_errors
from core.settings import public_url

SANDBOX_IMAGE_PLACEHOLDER = "crucible/placeholder:validate"
"""The sandbox section has no image of its own (the spec's `image` is resolved at build time)."""
IMAGE_REF = r"^([a-z0-9][a-z0-9.-]{0,99}(:[0-9]{1,5})?/)?[a-z0-9][a-z0-9._/-]{0,199}(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@sha256:[0-9a-f]{64})?$"
"""A Docker image reference as a task may name one: [registry[:port]/]repository[:tag][@digest]; no options,
no spaces, nothing a shell or the engine would read as more than a name."""
_IMAGE_GLOB = r"^[a-z0-9*?\[][a-z0-9._/:@*?\[\]-]*$"


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=20, ge=1, le=1000)
    """Policy turns before the episode ends as `max_turns`."""
    max_context_tokens: int = Field(default=8192, ge=64)
    """Prompt + completion tokens; reaching it ends the episode as `context_exhausted`."""
    max_response_tokens: int = Field(default=512, ge=1)
    """Tokens the policy may sample in one turn."""
    episode_timeout_s: float = Field(default=600.0, gt=0, le=86400)
    """The agent's time budget: seconds its tool calls may spend in the sandbox, in all; past it the
    episode ends as `episode_timeout`. Time waiting on the policy servers is the platform's, not
    counted (task_workers/episode/loop.py); an OpenEnv client's clock is wall time (its model is its own)."""
    tool_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """Default deadline of one tool call inside the sandbox."""
    max_tool_errors: int = Field(default=5, ge=1)
    """Consecutive malformed or failing tool calls before `tool_error_limit` / `format_error`."""
    observation_max_chars: int = Field(default=4000, ge=100)
    """Tool output shown to the policy is capped head+tail to this many characters."""


def _http_url(value: str) -> str:
    """A learned reward's server: an http(s) URL with a host, nothing that could split a request line."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:  # a bad port or bracket
        ok = False
    if not ok or any(c.isspace() or ord(c) < 32 for c in value):
        raise ValueError(f"expected an http(s) URL such as http://127.0.0.1:8001/v1, got {value[:100]!r}")
    return value


class JudgeConfig(BaseModel):
    """A model judge as the verifier's last layer (`judge`, environments/judge.py): any OpenAI-compatible
    completions server, e.g. a vLLM of its own or the policy's. Its layer score counts with
    `verifier.weights.judge` (default 0: recorded, not rewarded) — pointwise, or pairwise within a group
    (`mode`)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048)
    """The judge server's OpenAI API root (`http://host:port/v1`)."""
    model: str = Field(min_length=1, max_length=512)
    """The model name the server serves."""
    rubric: str = Field(min_length=1, max_length=64 * 1024)
    mode: Literal["pointwise", "pairwise"] = "pointwise"
    """`pointwise`: each episode is scored alone, by its worker, as it ends. `pairwise` (GenRM-style):
    once every episode of a GRPO group has ended, each pair of them is compared, asked in both orders
    (A/B and B/A, so position bias cancels), and an episode's layer score is its mean win rate against
    the others (a split or unparsed answer is a tie, 0.5; a pair the judge refuses, too long for it,
    gives 0 to both). The group becomes claimable by the trainer only after the scores are stored; a
    judge outage leaves it unclaimable and is retried, and a group that fails `MAX_JUDGING_ATTEMPTS`
    times is dropped with the reason stored. Asking both orders cancels position bias, not an agent's
    injected answer: in either mode an episode whose text has a judge's answer line or a fence marker is
    flagged `judge_injection`, and `flag_policy` says what it costs. Flagged episodes (under
    `flag_policy: zero`) and ones that are not trained on are not compared; an episode with no one to
    compare with scores 0.5. `scale` does not apply."""
    scale: int = Field(default=10, ge=1, le=100)
    """Scores run from 0 to `scale`; the layer's score is score / scale."""
    pass_threshold: float = Field(default=0.5, ge=0, le=1)
    """The layer counts as passed at this normalised score or above."""
    constrain: bool = True
    """Enforce the answer's form with vLLM's structured outputs (a regex); off: parse a free answer."""
    max_tokens: int = Field(default=256, ge=16, le=4096)
    temperature: float = Field(default=0.0, ge=0, le=2)
    max_transcript_chars: int = Field(default=12_000, ge=500, le=200_000)
    """The episode's text is cut (head and tail kept) to this many characters in the judge's prompt."""
    timeout_s: float = Field(default=60.0, gt=0, le=600)
    retries: int = Field(default=2, ge=0, le=10)
    """Retries of a judge that does not answer; after them the episode is an infrastructure fault."""

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, value: str) -> str:
        return _http_url(value)


class RewardModelConfig(BaseModel):
    """A preference reward model as a verifier layer (`reward_model`, environments/reward_model_layer.py),
    served by `crucible rm serve`. Its layer score σ(R) counts with `verifier.weights.reward_model`."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048)
    """The server's API root (`http://host:port/v1`; the layer posts to `/score`)."""
    pass_threshold: float = Field(default=0.5, ge=0, le=1)
    timeout_s: float = Field(default=60.0, gt=0, le=600)
    retries: int = Field(default=2, ge=0, le=10)

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, value: str) -> str:
        return _http_url(value)


class VerifierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weights: dict[str, float] = Field(default_factory=dict)
    """Reward = sum of weight * layer score. Layers not named get weight 0 (logged, not rewarded)."""
    protected_paths: list[str] | None = Field(default=None, max_length=1000)
    """Globs the agent may not change (code_repo); None: the kind's defaults (tests, conftest.py,
    runner configuration, runner-shadowing modules, .gitattributes). A task may add more."""
    flag_policy: Literal["zero", "penalize", "record"] = "zero"
    """What a hack-monitor flag costs: `zero` the reward (the test layers do not run), `penalize`
    (subtract `flag_penalty` from the reward), or `record` it only."""
    flag_penalty: float = Field(default=1.0, ge=0, le=100)
    """Subtracted from a flagged episode's reward under `flag_policy: penalize`."""
    blind_hidden_tests: bool = True
    """code_repo: grade hidden tests blinded when the task has a reference solution — their expected
    values never enter the graded sandbox (environments/code_repo/blinding.py). Off: every task is
    graded from the in-process report, and its layer says `unblinded`."""
    mix: Literal["sum", "zscore"] = "sum"
    """How the layers make the reward the trainer learns from. `sum`: the episode's reward, Σ weight ×
    layer score, as the worker computed it. `zscore`: the trainer aligns the scales first — each layer
    named in `weights` is z-scored within this environment across the batch, then mixed as Σ α × z
    (α: its weight) — so a layer with a large or shifted scale (a judge's 0–100, a reward model's R)
    does not drown the others (seed §2: mix learned and verifiable rewards only after aligning scales)."""
    judge: JudgeConfig | None = None
    """A model judge as the last layer (any kind): see JudgeConfig."""
    reward_model: RewardModelConfig | None = None
    """A preference reward model as a layer (any kind): see RewardModelConfig."""

    @model_validator(mode="after")
    def _zscore_names_its_layers(self) -> VerifierConfig:
        if self.mix == "zscore" and not any(weight for weight in self.weights.values()):
            raise ValueError("mix: zscore mixes the layers named in weights (α per layer); expected weights such as "
                             "{hidden_tests: 0.7, judge: 0.3}, got none")
        return self


class EnvironmentSpec(BaseModel):
    """A registered environment. Immutable once registered: a change is a new version."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    kind: str = Field(min_length=1, max_length=64)
    """Environment kind from the registry (`code_repo`, …); also the Celery queue its episodes use."""
    description: str = Field(default="", max_length=4096)
    image: str = Field(default="code-repo", min_length=1, max_length=256)
    sandbox: dict[str, Any] = Field(default_factory=dict, max_length=64)
    """Sandbox limits (cpus, memory, pids, workspace size…), validated against the sandbox spec here,
    at submission, so a bad value is refused at registration rather than by every episode's worker."""
    tools: list[Annotated[str, Field(min_length=1, max_length=128)]] | None = Field(default=None, max_length=256)
    """Subset of the kind's tools to offer; None offers all of them."""
    limits: Limits = Field(default_factory=Limits)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    system_prompt: str | None = Field(default=None, max_length=256 * 1024)
    kind_config: Any = None
    """The kind's own section, written under the kind's name (`browser: {viewport: …}` for kind browser,
    `openenv: {app: …}` for kind openenv) and validated by the kind's `config_model`; None where the spec
    has none. Which model validates it is chosen by `kind` (a union discriminated on `kind`, dispatched
    through the registry so this module names no kind)."""
    tool_parser: str = Field(default="auto", max_length=64)
    """How tool calls are read out of completion text: `auto` (the served model's chat-template family's
    parser, core/renderers.py) or a name in environments.parsing.PARSERS. The token-in completions API
    that keeps prompts token-exact bypasses vLLM's own tool parsers, so the worker parses."""
    task_images: list[Annotated[str, Field(min_length=1, max_length=256, pattern=_IMAGE_GLOB)]] = Field(
        default_factory=list, max_length=64)
    """Globs of the image tags this environment's tasks may name for themselves (a code_repo task's
    `image`, e.g. a SWE-bench instance's `sweb.eval.x86_64.*`). Empty: a task naming an image is refused
    at import. The operator's choice, not the uploader's: a task cannot pick any image on the engine."""

    @field_validator("sandbox")
    @classmethod
    def _sandbox_is_valid(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "image" in value:
            raise ValueError(f"expected no image here (the spec's `image` field names it), got {value['image']!r}")
        try:
            SandboxSpec(image=SANDBOX_IMAGE_PLACEHOLDER, **value)
        except ValidationError as error:
            raise ValueError(describe_errors(error)) from None
        except TypeError as error:  # a non-string key cannot be a field name
            raise ValueError(f"expected field names as keys, got {error}") from None
        return value

    @model_validator(mode="after")
    def _parser_is_known(self) -> EnvironmentSpec:
        from environments.parsing import AUTO, PARSERS

        if self.tool_parser != AUTO and self.tool_parser not in PARSERS:
            raise ValueError(f"tool_parser: expected {AUTO} or one of {', '.join(sorted(PARSERS))}, "
                             f"got {self.tool_parser!r}")
        return self


    def allows_task_image(self, image: str) -> bool:
        return any(fnmatch.fnmatchcase(image, glob) for glob in self.task_images)

    def for_task(self, task: Any) -> EnvironmentSpec:
        """The spec one episode runs under: the environment's, or its copy on the image the task names
        (its agent sandbox and every grading sandbox then start from that image). ConfigError when the
        task names an image this spec does not allow (checked at import too; checked again here because
        the spec is what the operator controls)."""
        image = getattr(task, "image", None)
        if image is None:
            return self
        if not self.allows_task_image(image):
            allowed = ", ".join(self.task_images) or "none: task_images is empty"
            raise ConfigError(f"image: expected an image the environment's task_images allows ({allowed}), got {image!r}")
        return self.on_image(image, masked=getattr(task, "masked_paths", ()))

    def on_image(self, image: str, *, masked: tuple[str, ...] = ()) -> EnvironmentSpec:
        """This spec on another image, whose sandboxes no pool keeps (environments.sandboxes.DockerSandboxes):
        a task's own image, or a factory package's; `masked`: directories of it every sandbox hides. Not
        checked against task_images: see for_task."""
        sandbox = {**self.sandbox, "masked_paths": [*self.sandbox.get("masked_paths", ()), *masked]} if masked else self.sandbox
        spec = self.model_copy(update={"image": image, "sandbox": sandbox})
        spec._task_image = image
        return spec

    @property
    def task_image(self) -> str | None:
        """The image a task named, when this spec is that task's copy (for_task); else None."""
        return self._task_image

    _task_image: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _kind_section_in(cls, data: Any) -> Any:
        """The section named after the spec's kind becomes `kind_config`; another kind's section is refused
        (one that is null, as older stored specs carry for every kind, is nothing)."""
        if not isinstance(data, dict):
            return data
        from environments.registry import kind_names

        if "kind_config" in data:
            raise ValueError(f"kind_config: expected the kind's section under the kind's own name (`"
                             f"{str(data.get('kind', '<kind>'))[:64]}: {{…}}`), got a key kind_config")
        kind, names = data.get("kind"), kind_names()
        data = dict(data)
        for name in [key for key in data if key in names and key != "kind"]:
            section = data.pop(name)
            if section is None:
                continue
            if name != kind:
                raise ValueError(f"{name}: expected this section only for kind {name}, got kind {kind!r}")
            data["kind_config"] = section
        return data

    @model_validator(mode="after")
    def _kind_rules(self) -> EnvironmentSpec:
        """The kind's own section validated by its `config_model`, then the kind's own rules (`check_spec`)."""
        from environments.registry import get_kind, kind_names

        if self.kind not in kind_names():
            raise ValueError(f"kind: expected one of {', '.join(sorted(kind_names()))}, got {self.kind!r}")
        kind = get_kind(self.kind)
        if self.kind_config is not None:
            if kind.config_model is None:
                raise ValueError(f"{self.kind}: expected no section for kind {self.kind} (it has no settings of "
                                 f"its own), got one")
            if not isinstance(self.kind_config, kind.config_model):
                try:
                    self.kind_config = kind.config_model.model_validate(self.kind_config)
                except ValidationError as error:
                    raise ValueError(_section_errors(self.kind, error)) from None
        if self.task_images and not kind.task_images:
            raise ValueError(f"task_images: expected it only for a kind whose tasks may name an image, got kind "
                             f"{self.kind!r}")
        kind.check_spec(self)
        return self

    @model_serializer(mode="wrap")
    def _kind_section_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Dumped as written: the kind's section under the kind's name, absent where there is none."""
        data: dict[str, Any] = handler(self)
        section = data.pop("kind_config", None)
        if section is not None:
            data[self.kind] = section
        return data

    @model_validator(mode="after")
    def _tools_are_the_kinds(self) -> EnvironmentSpec:
        """At registration, not at every episode: `tools: ["../../bin/sh"]` was stored and failed later."""
        from environments.registry import kind_names, kind_tools

        if self.tools is None or self.kind not in kind_names():
            return self
        offered = kind_tools(self.kind)
        unknown = [name for name in self.tools if name not in offered]
        if unknown or len(set(self.tools)) != len(self.tools) or not self.tools:
            raise ValueError(f"tools: expected distinct names among {', '.join(offered)} (kind {self.kind}), got "
                             f"{json.dumps(self.tools)[:300]}")
        return self

    def content_hash(self) -> str:
        data = self.model_dump(mode="json")
        # A kind's section is dumped only where there is one: specs from before the sections existed keep
        # their hash, as the `null` sections older dumps carried were dropped here.
        for section in ("judge", "reward_model"):  # likewise for the learned layers
            if data["verifier"].get(section) is None:
                data["verifier"].pop(section, None)
        if data["verifier"].get("mix") == "sum":  # and for the mixing rule, at its default
            data["verifier"].pop("mix")
        if data["verifier"].get("blind_hidden_tests") is True:  # and for blinding, at its default
            data["verifier"].pop("blind_hidden_tests")
        if not data.get("task_images"):  # and for task images, at their default
            data.pop("task_images", None)
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def _section_errors(kind: str, error: ValidationError) -> str:
    """`kind.field: what is wrong (got value)`, a clause a bad field, for the kind's own section."""
    parts = []
    for item in error.errors():
        where = ".".join([kind, *map(str, item["loc"])])
        message = str(item["msg"]).removeprefix("Value error, ")
        given = "" if " got " in message or item["type"] == "missing" else f" (got {str(item.get('input'))[:80]!r})"
        parts.append(f"{where}: {message}{given}")
    return "; ".join(parts)


def check_network_policy(spec: EnvironmentSpec, *, allowed: list[str]) -> None:
    """At submission: a sandbox may join a named network only if the operator listed it
    (CRUCIBLE_SANDBOX_NETWORKS). Checked at registration, not on every parse of a stored spec."""
    network = str(spec.sandbox.get("network", "none"))
    if network == "none" and not spec.sandbox.get("allow_network"):
        return
    if network not in allowed:
        listed = ", ".join(allowed) if allowed else "none: CRUCIBLE_SANDBOX_NETWORKS is unset"
        raise ConfigError(f"sandbox.network: expected a network the operator allows ({listed}), got {network!r}"
                          + (" with allow_network" if spec.sandbox.get("allow_network") else ""))


def check_reward_servers(spec: EnvironmentSpec, *, allows: Callable[[str], bool]) -> None:
    """At submission: a judge or reward model URL must be a server the operator allows (the policy
    servers, or CRUCIBLE_REWARD_SERVERS): workers post every episode there and store what it answers,
    so a spec must not aim them at an arbitrary address (an internal service, a metadata endpoint)."""
    for section, config in (("judge", spec.verifier.judge), ("reward_model", spec.verifier.reward_model)):
        if config is not None and not allows(config.url):
            raise ConfigError(f"verifier.{section}.url: expected a policy server or one listed in "
                              f"CRUCIBLE_REWARD_SERVERS, got {public_url(config.url)!r}")


def parse_spec(data: Any, *, source: str = "environment spec") -> EnvironmentSpec:
    return parse_model(EnvironmentSpec, data, source=source)


def load_spec_file(path: Path) -> EnvironmentSpec:
    """Read a YAML or JSON spec file; every problem is a ConfigError naming the file and the field."""
    return load_model_file(EnvironmentSpec, path, what="spec file")
