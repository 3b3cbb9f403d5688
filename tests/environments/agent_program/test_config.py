"""(issue 51) The `agent_program` section at registration: what it refuses, by name, and what it runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.errors import ConfigError
from environments.agent_program.config import INSTRUCTION, ProgramConfig
from environments.agent_program.images import PROGRAMS
from environments.spec import parse_spec

ROOT = Path(__file__).resolve().parents[3]


def spec(**section: object) -> dict:
    return {"name": "prog", "kind": "agent_program", "agent_program": {"command": ["true"], **section}}


@pytest.mark.parametrize(("section", "message"), [
    ({"command": []}, "command"),
    ({"env": {"OPENAI_BASE_URL": "http://evil:1/v1"}}, "OPENAI_BASE_URL"),
    ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "LD_PRELOAD"),
    ({"env": {"lower": "x"}}, "env"),
    ({"action_regex": "(unclosed"}, "action_regex"),
    ({"max_calls": 0}, "max_calls"),
    ({"timeout_s": -1}, "timeout_s"),
    ({"unknown": 1}, "unknown"),
])
def test_a_bad_section_is_refused_naming_the_field(section: dict, message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        parse_spec(spec(**section))


def test_no_section_or_tools_are_refused_and_another_kinds_section_too() -> None:
    with pytest.raises((ConfigError, ValueError), match="agent_program"):
        parse_spec({"name": "prog", "kind": "agent_program"})
    with pytest.raises((ConfigError, ValueError), match="tools"):
        parse_spec({**spec(), "tools": ["bash"]})
    with pytest.raises((ConfigError, ValueError), match="agent_program"):
        parse_spec({"name": "calc", "kind": "code_repo", "agent_program": {"command": ["true"]}})


def test_the_instruction_is_one_argument_whatever_it_holds() -> None:
    hostile = "x'; rm -rf / ; echo \"$(id)\" `reboot` {instruction}"
    config = ProgramConfig(command=["agent", "--task", INSTRUCTION, f"pre-{INSTRUCTION}"])
    assert config.argv(hostile) == ["agent", "--task", hostile, f"pre-{hostile}"]


def test_the_shipped_example_runs_mini_swe_agent_as_its_recipe_does() -> None:
    example = parse_spec(yaml.safe_load((ROOT / "examples" / "mini-swe-agent.yaml").read_text()))
    assert isinstance(example.kind_config, ProgramConfig)
    recipe = ProgramConfig.model_validate({**PROGRAMS["mini-swe-agent"].section, "max_calls": 30, "timeout_s": 600})
    assert example.kind_config == recipe
