"""agent_2pc_export and agent_2pc_import over MCP (results checked against each tool's
outputSchema by the SDK's client): a bundle exported by one server's workspace is imported by
another's, answered again when imported twice; a tampered bundle is a no (ok:false), a file
that is not a bundle is a tool error (isError) with code invalid_bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import read, write
from mcpkit import error, no, ok, server_params, session

from agent_2pc import Agent2PC

pytestmark = pytest.mark.timeout(90)


def test_export_in_one_workspace_import_review_and_commit_in_another(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        write(str(root), "f.txt", "base\n")
        Agent2PC.init(root).close()
    bundle = str(tmp_path / "t.a2pc")

    async def export(c: Any) -> dict[str, Any]:
        tid = ok(await c.call_tool("agent_2pc_begin", {"label": "mcp"}))["tid"]
        ok(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": "f.txt",
                                                       "content": "changed\n"}))
        return ok(await c.call_tool("agent_2pc_export", {"tid": tid, "path": bundle}))

    exported = session(server_params(str(a)), export)
    assert exported["bytes"] == Path(bundle).stat().st_size

    bad = tmp_path / "bad.a2pc"
    data = bytearray(Path(bundle).read_bytes())
    data[-20] ^= 0xFF  # in the checksum member: the bytes fail their hash
    bad.write_bytes(bytes(data))
    (tmp_path / "not.a2pc").write_text("hello")

    async def review(c: Any) -> dict[str, Any]:
        imported = ok(await c.call_tool("agent_2pc_import", {"path": bundle}))
        again = ok(await c.call_tool("agent_2pc_import", {"path": bundle}))
        tampered = no(await c.call_tool("agent_2pc_import", {"path": str(bad)}), "tampered")
        invalid = error(await c.call_tool("agent_2pc_import",
                                          {"path": str(tmp_path / "not.a2pc")}),
                        "invalid_bundle")
        diff = ok(await c.call_tool("agent_2pc_diff", {"tid": imported["tid"]}))
        committed = ok(await c.call_tool("agent_2pc_commit", {"tid": imported["tid"]}))
        return {"imported": imported, "again": again, "tampered": tampered,
                "invalid": invalid, "diff": diff, "committed": committed}

    out = session(server_params(str(b)), review)
    assert out["imported"]["files"] == ["f.txt"] and out["imported"]["again"] is False
    assert out["imported"]["origin"]["tid"] == exported["tid"]
    assert out["again"]["tid"] == out["imported"]["tid"] and out["again"]["again"] is True
    assert "+changed" in out["diff"]["diff"]
    assert out["committed"]["state"] == "committed"
    assert read(str(b), "f.txt") == b"changed\n"
    assert read(str(a), "f.txt") == b"base\n"
