"""Malformed JSON-RPC is answered as the specification says (issue 10, item 10): bytes that are not
JSON get -32700 with id null, JSON that is not a valid message gets -32600 (with the message's
id when it has a valid one), and the server goes on serving. Raw bytes are written to the stdin
of the real processes -- ``agent-2pc mcp`` and ``agent-2pc mcp wrap`` -- on a pipe (as MCP
clients start servers), a regular file and a terminal; the transport itself is driven in-process
for a line over its length limit.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import termios
from typing import Any

import anyio
import pytest
from mcpkit import RawClient, env, server_params, wrap_params

from agent_2pc.mcp import _stdio

pytestmark = pytest.mark.timeout(90)

PARSE_ERROR, INVALID_REQUEST = -32700, -32600
# A line, and the (code, id) of its answer.
MALFORMED: list[tuple[bytes, int, Any]] = [
    (b"this is not JSON {", PARSE_ERROR, None),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "tools/list"', PARSE_ERROR, None),  # cut short
    (b'\xff\xfe{"jsonrpc": "2.0"}', PARSE_ERROR, None),                          # not UTF-8
    (b'{"jsonrpc": "2.0", "id": 7, "method": 3}', INVALID_REQUEST, 7),
    (b'{"jsonrpc": "1.0", "id": "a", "method": "tools/list"}', INVALID_REQUEST, "a"),
    (b'{"id": 8, "method": "tools/list"}', INVALID_REQUEST, 8),
    (b'{"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": [1]}', INVALID_REQUEST, 9),
    (b'{"jsonrpc": "2.0", "id": null, "method": "tools/list"}', INVALID_REQUEST, None),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}', INVALID_REQUEST, None),
    (b'{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', INVALID_REQUEST, None),
    (b'{"jsonrpc": "2.0", "id": 11}', INVALID_REQUEST, 11),
    (b'{"jsonrpc": "2.0"}', INVALID_REQUEST, None),
    (b"[]", INVALID_REQUEST, None),
    (b'[{"jsonrpc": "2.0", "id": 10, "method": "tools/list"}]', INVALID_REQUEST, None),
    (b"42", INVALID_REQUEST, None),
    (b'"tools/list"', INVALID_REQUEST, None),
    (b"null", INVALID_REQUEST, None),
]
BATCH = b"".join(line + b"\n" for line, _, _ in MALFORMED)


def check_answers(answers: list[dict[str, Any]]) -> None:
    assert len(answers) == len(MALFORMED)
    for (line, code, rid), answer in zip(MALFORMED, answers, strict=True):
        assert answer["jsonrpc"] == "2.0" and "result" not in answer, (line, answer)
        assert answer["id"] == rid and answer["error"]["code"] == code, (line, answer)
        assert answer["error"]["message"], (line, answer)


def _params(kind: str, root: str, tmp_path: Any) -> Any:
    if kind == "mcp":
        return server_params(root)
    return wrap_params(root, str(tmp_path / "effects.jsonl"),
                       downstream_env={"DOWNSTREAM_SLEEP_S": "0"})


@pytest.mark.parametrize("revision", ["2025-06-18", "2026-07-28"])
@pytest.mark.parametrize("kind", ["mcp", "wrap"])
def test_malformed_messages_are_answered_and_the_server_keeps_serving(
        root: str, tmp_path: Any, kind: str, revision: str) -> None:
    tool, args = ("agent_2pc_status", {}) if kind == "mcp" else ("charge", {"amount": 1})
    with RawClient(_params(kind, root, tmp_path)) as raw:
        raw.send_bytes(BATCH)                     # before anything else: the era is not decided
        check_answers([raw.read() for _ in MALFORMED])
        raw.initialize(revision)
        raw.send_bytes(BATCH)                     # and during the session
        check_answers([raw.read() for _ in MALFORMED])
        bad_params = raw.request("tools/call", {"name": tool, "arguments": "not an object"})
        assert bad_params["error"]["code"] == -32602
        assert raw.request("no/such/method")["error"]["code"] == -32601
        answer = raw.request("tools/call", {"name": tool, "arguments": args})
        assert answer["result"]["isError"] is False, answer
        assert raw.close() == 0


@pytest.mark.parametrize("kind", ["mcp", "wrap"])
def test_malformed_messages_from_a_file_are_answered_in_order(root: str, tmp_path: Any,
                                                              kind: str) -> None:
    """stdin and stdout regular files (not pipes): the transport that reads in a worker thread.
    Every line gets its answer, in order, and the valid request after them too."""
    params = _params(kind, root, tmp_path)
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(BATCH + json.dumps({"jsonrpc": "2.0", "id": 99, "method": "initialize",
                                        "params": {"protocolVersion": "2025-11-25",
                                                   "capabilities": {},
                                                   "clientInfo": {"name": "f", "version": "0"}}
                                        }).encode() + b"\n")
    with open(src, "rb") as stdin, open(dst, "wb") as stdout:
        proc = subprocess.run([params.command, *params.args], stdin=stdin, stdout=stdout,
                              stderr=subprocess.DEVNULL, env=params.env, cwd=params.cwd,
                              timeout=60, check=False)
    assert proc.returncode == 0
    answers = [json.loads(line) for line in dst.read_bytes().splitlines()]
    check_answers(answers[:-1])
    assert answers[-1]["id"] == 99 and answers[-1]["result"]["protocolVersion"] == "2025-11-25"


def test_malformed_messages_typed_on_a_terminal_are_answered(root: str) -> None:
    """``agent-2pc mcp`` with a terminal for stdin and stdout (a pseudo-terminal, echo off)."""
    leader, follower = os.openpty()
    attrs = termios.tcgetattr(follower)
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(follower, termios.TCSANOW, attrs)
    proc = subprocess.Popen([sys.executable, "-m", "agent_2pc", "--root", root, "mcp"],
                            stdin=follower, stdout=follower, stderr=subprocess.DEVNULL,
                            env=env(), close_fds=True)
    os.close(follower)
    try:
        os.write(leader, b"hello?\n" + b'{"jsonrpc": "2.0", "id": 3, "method": []}\n'
                 + b'{"jsonrpc": "2.0", "id": 4, "method": "ping"}\n')
        buf = b""
        while buf.count(b"\n") < 3:
            ready, _, _ = select.select([leader], [], [], 30)
            assert ready, buf
            buf += os.read(leader, 4096)
        answers = [json.loads(line) for line in buf.splitlines() if line.strip()]
        assert [(a["id"], a.get("error", {}).get("code")) for a in answers] == \
            [(None, PARSE_ERROR), (3, INVALID_REQUEST), (4, None)]
        assert answers[2]["result"] == {}
        os.write(leader, b"\x04")  # ^D: the end of input
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)


@pytest.mark.parametrize("wire", ["pipe", "file"])
def test_a_line_over_the_limit_is_discarded_and_answered(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, wire: str) -> None:
    """The transport in-process, its limit lowered to 1,000 bytes: an over-long line is refused
    (-32600, id null) without being read into memory whole, and the next line is served."""
    monkeypatch.setattr(_stdio, "LINE_BYTES_MAX", 1000)
    ping = b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n'
    data = b'{"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {"x": "' + b"y" * 5000 \
        + b'"}}\n' + ping
    out_path = tmp_path / "out"
    if wire == "pipe":
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
    else:
        (tmp_path / "in").write_bytes(data)
        in_r = os.open(tmp_path / "in", os.O_RDONLY)
        out_w = os.open(out_path, os.O_WRONLY | os.O_CREAT)

    async def main() -> list[Any]:
        wire_obj: Any = await _stdio._PipeWire.open(in_r, out_w) if wire == "pipe" \
            else _stdio._FileWire(in_r, out_w)
        got: list[Any] = []
        async with _stdio._serving(wire_obj) as (incoming, outgoing):
            if wire == "pipe":
                os.write(in_w, data)
                os.close(in_w)
            async with incoming:
                async for item in incoming:
                    got.append(item)
                    await outgoing.send(item)  # echo the request: shows the order on the wire
        await wire_obj.close()
        return got

    got = anyio.run(main)
    assert [item.message.id for item in got] == [1]
    if wire == "pipe":
        with os.fdopen(out_r, "rb") as f:
            written = f.read()
    else:
        written = out_path.read_bytes()
    lines = [json.loads(line) for line in written.splitlines()]
    assert lines[0]["id"] is None and lines[0]["error"]["code"] == INVALID_REQUEST
    assert "longer than 1000 bytes" in lines[0]["error"]["message"]
    assert lines[1] == {"jsonrpc": "2.0", "id": 1, "method": "ping"}
