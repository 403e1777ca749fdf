"""The docs say what the code does: every command is documented, README's test command is the
one CI runs, and every error code the CLI can print is in the reference."""

from __future__ import annotations

import re
from pathlib import Path

from agent_2pc import errors
from agent_2pc.cli.commands import COMMANDS

ROOT = Path(__file__).resolve().parent.parent


def test_every_cli_command_has_a_section_in_the_reference():
    text = (ROOT / "docs" / "cli.md").read_text()
    for cmd in COMMANDS:
        if cmd.name != "fence":
            assert f"### {cmd.name}" in text, cmd.name


def test_readme_opens_with_the_demo_and_test_commands_and_ci_runs_the_latter():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^    (python3 -m venv .*)$", readme, re.M)
    assert len(commands) >= 2
    demo, tests = commands[0], commands[1]
    assert demo.endswith("agent-2pc demo") and "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_every_error_code_is_in_the_reference():
    text = (ROOT / "docs" / "cli.md").read_text()
    codes = {cls.code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.Agent2PCError)
             and cls.code not in ("internal", "intent_in_flight", "unknown_outcome")}
    for code in codes:
        assert f"`{code}`" in text, code
