"""The `openenv` section of an openenv environment's spec (environments.spec: a kind's own section is
named after the kind and validated by its `config_model`): which OpenEnv server its image runs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

RESERVED_ENV_PREFIXES = ("LD_", "PYTHON", "HF_", "UVICORN_")
RESERVED_ENV = ("PATH", "HOME", "TMPDIR", "LANG")


class OpenEnvSettings(BaseModel):
    """The `openenv` section of an openenv environment's spec: which OpenEnv server its image runs."""

    model_config = ConfigDict(extra="forbid")

    app: str = Field(min_length=3, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
    """The environment's ASGI app, `module:attribute` (what `uvicorn` is given), importable from `app_dir`."""
    app_dir: str = Field(default="/opt/openenv", max_length=256, pattern=r"^/[A-Za-z0-9_./-]*$")
    """The server's working directory in the image (environments/openenv/images.py puts files there)."""
    env: dict[Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Z_][A-Z0-9_]*$")],
              Annotated[str, Field(max_length=4096)]] = Field(default_factory=dict, max_length=32)
    """Environment variables of the server (its dataset path, its own reward settings); not the loader's,
    the interpreter's or the bridge's own (LD_*, PYTHON*, PATH, HOME, TMPDIR, HF_*)."""
    tool: str = Field(default="act", min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")
    """The name of the one tool the agent calls; its parameters are the environment's action schema."""
    reward: Literal["last", "sum"] = "last"
    """The `openenv` layer's score: the reward of the episode's last observation, or the sum over its steps."""
    require_done: bool = False
    """Whether an episode must reach an observation that says `done` to be paid: one that ends before (the
    turn limit, malformed calls after a well-paid step) earns `no_action_reward`. For an environment whose
    last step carries the verdict (DIPG's one answer)."""
    server: Literal["kept", "per_episode"] = "kept"
    """`kept`: one server for the sandbox's life, a new WebSocket session (a new instance) per episode;
    `per_episode`: a new server process per episode, for environments that run the agent's code in their own
    process or keep state at module level."""
    no_action_reward: float = Field(default=0.0, ge=-1e6, le=1e6, allow_inf_nan=False)
    """The layer's score when the environment never scored the episode: no action reached it (every call
    malformed or refused), its server failed on the agent's action, it gave no finite reward, or (with
    `require_done`) the episode ended before `done`. Set it to the environment's own price of a response it cannot
    read when its rewards go below 0 (DIPG's is −50), or a policy learns that saying nothing beats a wrong
    answer."""

    @field_validator("app_dir")
    @classmethod
    def _in_the_image(cls, value: str) -> str:
        if ".." in value.split("/") or not value.startswith("/opt/"):
            raise ValueError(f"expected a folder of the image under /opt without '..' (where the image builder "
                             f"puts it; nothing the sandbox can write), got {value!r}")
        return value

    @field_validator("env")
    @classmethod
    def _not_the_interpreters(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = sorted(name for name in value if name.startswith(RESERVED_ENV_PREFIXES) or name in RESERVED_ENV)
        if reserved:
            raise ValueError(f"expected the server's own settings, got {', '.join(reserved)} (the loader's, the "
                             f"interpreter's or the bridge's)")
        return value
