"""Environment specs: what a user registers (YAML or JSON) and a run pins by version.

    name: fix-python-bugs
    kind: code_repo
    image: code-repo            # an image under environments/images/, or any local image tag
    sandbox: {cpus: 1, memory: 1g, pids: 256}
    limits: {max_turns: 20, max_context_tokens: 8192, max_response_tokens: 512, episode_timeout_s: 600}
    verifier: {weights: {format: 0.1, public_tests: 0.2, hidden_tests: 0.7}}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.config_files import load_model_file, parse_model


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=20, ge=1, le=1000)
    """Policy turns before the episode ends as `max_turns`."""
    max_context_tokens: int = Field(default=8192, ge=64)
    """Prompt + completion tokens; reaching it ends the episode as `context_exhausted`."""
    max_response_tokens: int = Field(default=512, ge=1)
    """Tokens the policy may sample in one turn."""
    episode_timeout_s: float = Field(default=600.0, gt=0, le=86400)
    """Wall-clock budget of one episode; past it the episode ends as `episode_timeout`."""
    tool_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """Default deadline of one tool call inside the sandbox."""
    max_tool_errors: int = Field(default=5, ge=1)
    """Consecutive malformed or failing tool calls before `tool_error_limit` / `format_error`."""
    observation_max_chars: int = Field(default=4000, ge=100)
    """Tool output shown to the policy is capped head+tail to this many characters."""


class VerifierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weights: dict[str, float] = Field(default_factory=dict)
    """Reward = sum of weight * layer score. Layers not named get weight 0 (logged, not rewarded)."""
    hidden_tests_in_fresh_sandbox: bool = True
    """Grade the submitted diff in a new sandbox so the agent cannot tamper with its grader."""


class EnvironmentSpec(BaseModel):
    """A registered environment. Immutable once registered: a change is a new version."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    kind: str = Field(min_length=1)
    """Environment kind from the registry (`code_repo`, …); also the Celery queue its episodes use."""
    description: str = ""
    image: str = "code-repo"
    sandbox: dict[str, Any] = Field(default_factory=dict)
    """Sandbox limits (cpus, memory, pids, workspace size…), validated by the sandbox spec."""
    tools: list[str] | None = None
    """Subset of the kind's tools to offer; None offers all of them."""
    limits: Limits = Field(default_factory=Limits)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    system_prompt: str | None = None
    tool_parser: str = "hermes"
    """How tool calls are read out of completion text (environments.parsing.PARSERS). The token-in
    completions API that keeps prompts token-exact bypasses vLLM's own tool parsers, so the worker parses."""

    @model_validator(mode="after")
    def _parser_is_known(self) -> EnvironmentSpec:
        from environments.parsing import PARSERS

        if self.tool_parser not in PARSERS:
            raise ValueError(f"tool_parser: expected one of {', '.join(sorted(PARSERS))}, got {self.tool_parser!r}")
        return self

    @model_validator(mode="after")
    def _kind_is_registered(self) -> EnvironmentSpec:
        from environments.registry import kind_names

        if self.kind not in kind_names():
            raise ValueError(f"kind: expected one of {', '.join(sorted(kind_names()))}, got {self.kind!r}")
        return self

    def content_hash(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def parse_spec(data: Any, *, source: str = "environment spec") -> EnvironmentSpec:
    return parse_model(EnvironmentSpec, data, source=source)


def load_spec_file(path: Path) -> EnvironmentSpec:
    """Read a YAML or JSON spec file; every problem is a ConfigError naming the file and the field."""
    return load_model_file(EnvironmentSpec, path, what="spec file")
