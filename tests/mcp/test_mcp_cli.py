"""The CLI face of MCP: `agent-2pc mcp` and `mcp wrap` parse as documented, and no other command
pays for importing the SDK (about a second: mcp, mcp_types, pydantic, anyio)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from conftest import run_cli

from agent_2pc.cli.mcp import duration_s
from agent_2pc.errors import UsageError

pytestmark = pytest.mark.timeout(60)

HEAVY = ("mcp", "mcp_types", "pydantic", "pydantic_core", "anyio", "starlette")
PROBE = """\
import json, sys
from agent_2pc.cli.main import main
status = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
sys.stderr.write("\\nHEAVY " + json.dumps(heavy) + "\\n")
sys.exit(status)
""".format(heavy=set(HEAVY))


def probe(*argv: str) -> tuple[subprocess.CompletedProcess[bytes], list[str]]:
    """Run one CLI command in a fresh interpreter; return it and the heavy modules it loaded."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          timeout=60, stdin=subprocess.DEVNULL, check=False)
    tail = proc.stderr.decode().rsplit("HEAVY ", 1)
    assert len(tail) == 2, proc.stderr
    return proc, json.loads(tail[1])


def test_the_cli_never_imports_the_mcp_sdk_outside_the_mcp_command(root: str) -> None:
    proc, heavy = probe("--root", root, "begin", "--json")
    assert proc.returncode == 0 and heavy == []
    tid = json.loads(proc.stdout)["tid"]
    for argv in (("stage-write", "--tid", tid, "--path", "a.txt", "--content", "x"),
                 ("diff", "--tid", tid), ("status",), ("commit", "--tid", tid),
                 ("fence", "status"), ("mcp", "--help"), ("mcp", "wrap", "--help"),
                 ("no-such-command",)):
        proc, heavy = probe("--root", root, *argv, "--json")
        assert heavy == [], (argv, heavy)
    assert proc.returncode == 2  # the last one: a usage error, still light


def test_mcp_wrap_without_a_command_line_is_a_usage_error(root: str) -> None:
    proc = run_cli(("mcp", "wrap", "--window", "1m"), json_out=True, root=root)
    assert proc.returncode == 2
    obj = json.loads(proc.stdout)
    assert obj["error"]["code"] == "usage" and "after '--'" in obj["error"]["message"]
    proc = run_cli(("mcp", "wrap", "--window", "soon", "--json", "--", "true"), root=root)
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == "usage"


def test_mcp_help_describes_serving_and_wrapping(root: str) -> None:
    text = run_cli(("mcp", "--help"), root=root).stdout.decode()
    assert "wrap" in text and "--store" in text
    text = run_cli(("mcp", "wrap", "--help"), root=root).stdout.decode()
    for flag in ("--window", "--store", "--call-timeout", "-- CMD", "idempotencyKey"):
        assert flag in text, flag


@pytest.mark.parametrize("text, seconds", [("90", 90.0), ("90s", 90.0), ("500ms", 0.5),
                                           ("10m", 600.0), ("2h", 7200.0), ("1d", 86400.0),
                                           ("0", 0.0), ("1.5s", 1.5)])
def test_durations_parse(text: str, seconds: float) -> None:
    assert duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-1s", "1w", "nan", "inf", "1e30"])
def test_bad_durations_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        duration_s(text)


def test_run_bare_with_a_bad_store_it_still_starts_and_answers_per_call(root: str) -> Any:
    # The store is opened on first use: a bad URL is a tool error, not a dead server.
    from mcpkit import error, ok, server_params, session

    async def body(c: Any) -> None:
        error(await c.call_tool("fence_status", {}), "usage")
        ok(await c.call_tool("agent_2pc_status", {}))

    session(server_params(root, "--store", "bogus://x"), body)
