"""The monitoring docs say what the code does: each command has its section in the CLI
reference, the guide shows every screenshot kept under docs/monitoring/, README lists it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from agent_2pc.cli.monitor import MONITORING

ROOT = Path(__file__).resolve().parent.parent.parent


def test_each_monitoring_command_has_a_section_in_the_cli_reference():
    text = (ROOT / "docs" / "cli.md").read_text()
    for cmd in MONITORING:
        assert f"### {cmd.name}" in text, cmd.name


def test_the_guide_shows_every_screenshot_and_readme_lists_the_guide():
    guide = (ROOT / "docs" / "monitoring.md").read_text()
    shown = set(re.findall(r"\]\(monitoring/([\w.-]+\.png)\)", guide))
    kept = {n for n in os.listdir(ROOT / "docs" / "monitoring") if n.endswith(".png")}
    assert shown == kept and len(kept) >= 5
    assert "docs/monitoring.md" in (ROOT / "README.md").read_text()
    assert "FIGURES" not in guide
