"""Helpers for driving the real Claude Code CLI against the scripted API (fake_anthropic.py).

    exe = claude_exe()                      # skips the test when the CLI cannot be had
    with FakeAnthropic(script) as api:
        proc = run(claude_argv(exe, "prompt", ["Write", "mcp__agent-2pc"]),
                   cwd=root, env=claude_env(api, home))
    result = claude_result(proc.stdout)     # the --output-format json object

The CLI is the one that the ``claude-agent-sdk`` wheel bundles
(``claude_agent_sdk/_bundled/claude``); ``$AGENT2PC_CLAUDE`` names another one. Where it is
missing or does not start, the tests are skipped with the reason -- unless
``$AGENT2PC_REQUIRE_CLAUDE=1`` (CI), which makes that a failure.

How Claude Code is run (docs/mcp.md, "Tested end to end with Claude Code"):

- ``claude -p PROMPT --output-format json --permission-mode dontAsk --allowedTools T ...``:
  print mode (no terminal, no trust dialog), the tools the script uses allowed by name, and
  anything else denied instead of prompting. (``--permission-mode bypassPermissions`` and
  ``--dangerously-skip-permissions`` are refused when running as root, as CI does.)
- An environment built from nothing but ``PATH`` and the locale: a throwaway ``HOME``,
  ``CLAUDE_CONFIG_DIR`` and ``TMPDIR`` outside the repository, ``ANTHROPIC_BASE_URL`` = the
  stand-in, a dummy ``ANTHROPIC_API_KEY``, and every switch that turns other traffic off
  (``NETWORK_OFF``). ``ENABLE_TOOL_SEARCH=false`` makes Claude Code send the MCP tools' schemas
  in ``tools`` at once instead of deferring them behind its ToolSearch tool;
  ``MCP_CONNECTION_NONBLOCKING=false`` makes it wait for the MCP servers before the first
  request (checked: a server that takes 4 s to start fails two tests without it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from typing import Any, Sequence

import pytest
from fake_anthropic import FakeAnthropic

CLAUDE_TIMEOUT_S = 60
DUMMY_KEY = "sk-ant-test-dummy-key"
# Turn off all traffic but the API calls (the documented switches; the first one implies the
# next four in current versions, they are given as well for older ones).
NETWORK_OFF = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
}
# The version the tests were written against (Claude Code 2.1.332).
PIN = "0.2.189"
# Where the wheel keeps the binary, relative to the package directory.
BUNDLED = os.path.join("_bundled", "claude")


def _unavailable(reason: str) -> None:
    if os.environ.get("AGENT2PC_REQUIRE_CLAUDE") == "1":
        pytest.fail(f"Claude Code is required (AGENT2PC_REQUIRE_CLAUDE=1) but {reason}",
                    pytrace=False)
    pytest.skip(reason)


def find_claude() -> tuple[str | None, str]:
    """(path of the claude executable, or None; why not)."""
    given = os.environ.get("AGENT2PC_CLAUDE")
    if given:
        return (given, "") if os.access(given, os.X_OK) else (
            None, f"$AGENT2PC_CLAUDE={given} is not an executable")
    # Found, not imported: the binary is all these tests use of the package.
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or not spec.submodule_search_locations:
        return None, ("the claude-agent-sdk package (which ships the Claude Code CLI) is not "
                      f"installed: pip install 'claude-agent-sdk=={PIN}'")
    path = os.path.join(list(spec.submodule_search_locations)[0], BUNDLED)
    if not os.access(path, os.X_OK):
        return None, f"claude-agent-sdk is installed but has no bundled CLI at {path}"
    return path, ""


_VERSION: dict[str, str] = {}


def claude_exe() -> str:
    """The Claude Code executable, checked to start (``--version``); skips the test if not."""
    path, why = find_claude()
    if path is None:
        _unavailable(why)
        raise AssertionError("unreachable")
    if path not in _VERSION:
        try:
            proc = subprocess.run([path, "--version"], capture_output=True, text=True,
                                  timeout=30, stdin=subprocess.DEVNULL, env=base_env(),
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _unavailable(f"{path} --version did not run: {exc}")
        if proc.returncode != 0 or "Claude Code" not in proc.stdout:
            _unavailable(f"{path} --version failed ({proc.returncode}): "
                         f"{(proc.stdout + proc.stderr).strip()[:300]}")
        _VERSION[path] = proc.stdout.strip()
    return path


def base_env() -> dict[str, str]:
    """PATH (with this interpreter's bin first, for ``agent-2pc``) and the locale only: nothing
    of the developer's ANTHROPIC_*, CLAUDE_*, AGENT2PC_* or proxy settings gets in."""
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env = {"PATH": f"{bindir}{os.pathsep}{path}", "PYTHONDONTWRITEBYTECODE": "1"}
    for name in ("LANG", "LC_ALL", "TZ"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def claude_env(api: FakeAnthropic, home: str) -> dict[str, str]:
    """The environment Claude Code runs with: the stand-in API, a throwaway home, no traffic
    elsewhere."""
    config = os.path.join(home, ".claude")
    os.makedirs(config, exist_ok=True)
    env = base_env()
    env.update(NETWORK_OFF)
    env.update({
        "HOME": home,
        "CLAUDE_CONFIG_DIR": config,
        "TMPDIR": os.path.join(home, "tmp"),  # else it leaves /tmp/claude-UID/ behind
        "ANTHROPIC_BASE_URL": api.url,
        "ANTHROPIC_API_KEY": DUMMY_KEY,
        "ENABLE_TOOL_SEARCH": "false",
        # In print mode Claude Code does not wait for MCP servers by default: under load the
        # first request went out before agent-2pc's tools were listed (a flaky e2e run).
        "MCP_CONNECTION_NONBLOCKING": "false",
        # ... and it gives a server 30 s to connect by default: on a loaded 2-core machine
        # agent-2pc mcp's start (Python, the SDK, pydantic) took longer once.
        "MCP_TIMEOUT": "120000",
    })
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return env


def keep_log(api: FakeAnthropic, name: str) -> None:
    """With ``$AGENT2PC_E2E_LOG_DIR``, write every request the stand-in received to
    ``DIR/NAME.json`` (to see what a new Claude Code version asks for)."""
    where = os.environ.get("AGENT2PC_E2E_LOG_DIR")
    if where:
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, name + ".json"), "w") as f:
            json.dump({"requests": api.requests, "errors": api.errors}, f, indent=1)


def claude_argv(exe: str, prompt: str, allowed_tools: Sequence[str]) -> list[str]:
    return [exe, "-p", prompt, "--output-format", "json", "--permission-mode", "dontAsk",
            "--allowedTools", ",".join(allowed_tools), "--no-session-persistence"]


def run(argv: Sequence[str], *, cwd: str, env: dict[str, str],
        timeout_s: float = CLAUDE_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL, check=False)


def claude_result(text: str) -> dict[str, Any]:
    """The ``--output-format json`` result object: the last line of ``text`` that is one."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "result":
                return obj
    raise AssertionError(f"no Claude Code result object in {text[-2000:]!r}")


def agent_2pc_exe() -> list[str]:
    """The ``agent-2pc`` command of this interpreter (its console script, else ``-m``)."""
    script = os.path.join(os.path.dirname(sys.executable), "agent-2pc")
    if os.access(script, os.X_OK) and shutil.which(script):
        return [script]
    return [sys.executable, "-m", "agent_2pc"]
