"""Agent-program images: a program from PyPI installed into the code-repo image, for agent_program
environments to name as their `image`.

    crucible images agent mini-swe-agent     # -> crucible-agent/mini-swe-agent:<hash> (and :latest)

The wheels are resolved on the host by pip, wheels only, and copied into the image's site-packages
(environments/images/packages.py: no package's build backend runs, the build has no network). PROGRAMS holds
each program's requirements and the `agent_program` section that runs it (MINI_SWE_AGENT: mini-swe-agent's
text-based mode, its `mini` command with no prompt, no confirmation and no cost lookup, talking to the
episode's gateway through litellm's OpenAI provider).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from environments.agent_program.config import INSTRUCTION
from environments.images.build import image_tag
from environments.images.packages import wheel_image
from sandboxes.docker_client import docker_api

REPOSITORY = "crucible-agent"
MINI_SWE_AGENT = {
    "command": ["python3", "-m", "minisweagent.run.mini", "--config", "mini_textbased.yaml",
                "--model", "openai/policy", "--model-class", "litellm_textbased", "--agent-class", "default",
                "--yolo", "--exit-immediately", "--output", "/tmp/mini.traj.json", "--task", INSTRUCTION],
    "env": {"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_SILENT_STARTUP": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1"},
    "action_regex": r"```mswea_bash_command\s*\n(.*?)\n```",
}
"""The `agent_program` section that runs mini-swe-agent 2.x's text-based agent on the task."""


@dataclass(frozen=True)
class Program:
    requirements: tuple[str, ...]
    section: dict[str, Any] = field(default_factory=dict)
    """The spec's `agent_program` section that runs it."""


PROGRAMS: dict[str, Program] = {
    "mini-swe-agent": Program(requirements=("mini-swe-agent==2.4.6",), section=MINI_SWE_AGENT),
}


def program_image(name: str, *, base_tag: str | None = None) -> str:
    """The tag of program `name`'s image on the code-repo image (built if missing; `:latest` moved to it)."""
    if name not in PROGRAMS:
        raise ValueError(f"program: expected one of {', '.join(sorted(PROGRAMS))}, got {name!r}")
    tag = wheel_image(base_tag or image_tag("code-repo"), repository=REPOSITORY, name=name,
                      requirements=list(PROGRAMS[name].requirements))
    docker_api().tag(tag, tag.rsplit(":", 1)[0], "latest", force=True)
    return tag
