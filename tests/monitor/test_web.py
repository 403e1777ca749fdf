"""`agent-2pc web` over HTTP: the token on every request (401 with nothing leaked), the monitor
object at /api/transactions, read-only unless --allow-actions, CSRF and origin checks on
actions, a port in use, logs served only from a transaction's scratch, a corrupt log reported
while the server keeps serving, 10k finished transactions paginated."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest
from conftest import run_cli

from agent_2pc.storage import wal_format

from .webkit import Web

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tx(client):
    t = client.begin(label="secret-label")
    t.stage_write("secret.txt", "classified\n")
    return t


def test_the_first_line_is_the_url_and_the_api_gives_the_monitor_object(root, tx):
    with Web(root, "--port", "0") as web:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{20,}", web.url)
        r = httpx.get(web.api("/api/transactions"))
        assert r.status_code == 200
        out = r.json()
        cli = json.loads(run_cli(("monitor",), json_out=True, root=root).stdout)
        assert out["ok"] is True and set(out) == set(cli)
        assert out["in_flight"][0]["tid"] == tx.tid and out["health"] == "healthy"
        page = httpx.get(web.url)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert page.headers["referrer-policy"] == "no-referrer"
        assert "script-src 'self'" in page.headers["content-security-policy"]


@pytest.mark.parametrize("token", [None, "", "wrong-token", "x" * 32])
def test_without_the_right_token_every_path_is_401_and_says_nothing(root, tx, token):
    with Web(root, "--port", "0") as web:
        paths = ["/", "/static/app.js", "/static/style.css", "/api/transactions",
                 f"/api/transactions/{tx.tid}", f"/api/transactions/{tx.tid}/diff",
                 "/api/history", "/api/ledger", "/api/events", "/no/such/path",
                 "/static/../../../etc/passwd"]
        bodies = set()
        for path in paths:
            url = web.base + path + ("" if token is None else f"?token={token}")
            r = httpx.get(url, timeout=5)
            assert r.status_code == 401, path
            bodies.add(r.content)
            assert tx.tid.encode() not in r.content and b"secret" not in r.content
            assert root.encode() not in r.content
        for action in ("abort", "commit"):
            r = httpx.post(web.base + f"/api/transactions/{tx.tid}/{action}"
                           + ("" if token is None else f"?token={token}"))
            assert r.status_code == 401
        assert len(bodies) == 1  # one fixed answer, whatever was asked
        h = httpx.get(web.base + "/api/transactions", headers={"X-Agent2PC-Token": "nope"})
        assert h.status_code == 401
        h = httpx.get(web.base + "/api/transactions", headers={"X-Agent2PC-Token": web.token})
        assert h.status_code == 200


def test_a_foreign_host_header_is_refused_even_with_the_token(root, tx):
    with Web(root, "--port", "0") as web:
        r = httpx.get(web.api("/api/transactions"), headers={"Host": "evil.example:80"})
        assert r.status_code == 421 and tx.tid.encode() not in r.content


def test_the_event_stream_needs_the_token_and_sends_snapshots(root, tx):
    with Web(root, "--port", "0") as web:
        with httpx.stream("GET", web.base + "/api/events") as r:
            assert r.status_code == 401
        with httpx.stream("GET", web.api("/api/events"), timeout=10) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            seen = ""
            for chunk in r.iter_text():
                seen += chunk
                if "event: snapshot" in seen and seen.count("\n\n") >= 2:
                    break
        data = seen.split("data: ", 1)[1].split("\n\n", 1)[0]
        assert json.loads(data)["in_flight"][0]["tid"] == tx.tid


def test_read_only_by_default_actions_change_nothing(root, tx):
    with Web(root, "--port", "0") as web:
        r = httpx.post(web.api(f"/api/transactions/{tx.tid}/abort"),
                       headers={"Origin": web.base})
        assert r.status_code == 403 and r.json()["error"]["code"] == "read_only"
    assert tx.state() == "active"


def test_actions_need_the_csrf_header_and_the_same_origin(root, tx):
    with Web(root, "--port", "0", "--allow-actions") as web:
        page = httpx.get(web.url).text
        csrf = re.search(r'name="a2pc-csrf" content="([^"]+)"', page).group(1)
        url = web.api(f"/api/transactions/{tx.tid}/abort")
        for headers in ({}, {"X-CSRF-Token": "forged", "Origin": web.base},
                        {"X-CSRF-Token": csrf, "Origin": "http://evil.example"},
                        {"X-CSRF-Token": csrf, "Origin": web.base,
                         "Sec-Fetch-Site": "cross-site"}):
            r = httpx.post(url, headers=headers)
            assert r.status_code == 403 and r.json()["error"]["code"] == "csrf", headers
            assert tx.state() == "active"
        r = httpx.post(url, headers={"X-CSRF-Token": csrf, "Origin": web.base})
        assert r.status_code == 200 and r.json()["state"] == "aborted"
    assert tx.state() == "aborted"


def test_a_port_in_use_is_a_clear_error_with_exit_2(root):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        proc = run_cli(("web", "--port", str(port)), root=root)
        assert proc.returncode == 2
        assert proc.stdout == b""  # no URL printed for a server that does not run
        assert f"port {port}".encode() in proc.stderr and b"[port_in_use]" in proc.stderr
    finally:
        busy.close()


def test_a_check_log_is_served_only_from_the_transactions_scratch(root, client):
    t = client.begin()
    t.stage_cmd("echo checked-output")
    wal = os.path.join(root, ".agent-tx", "wal.bin")
    forged = {"type": "check", "tid": t.tid, "ts": int(time.time() * 1000), "key": "forged",
              "command": "cat", "options": {}, "fingerprint": "x", "passed": True,
              "exit_code": 0, "log": "/etc/passwd"}
    with open(wal, "ab") as f:
        f.write(wal_format.encode(forged))
    with Web(root, "--port", "0") as web:
        ok = httpx.get(web.api(f"/api/transactions/{t.tid}/checks/0/log")).json()
        assert ok["ok"] and "checked-output" in ok["text"]
        bad = httpx.get(web.api(f"/api/transactions/{t.tid}/checks/1/log"))
        assert bad.status_code == 400 and "root:" not in bad.text


def test_a_corrupt_log_is_reported_and_the_server_keeps_serving(root, client):
    for i in range(3):
        client.begin(label=f"t{i}")
    wal = os.path.join(root, ".agent-tx", "wal.bin")
    with Web(root, "--port", "0") as web:
        assert httpx.get(web.api("/api/transactions")).json()["health"] == "healthy"
        with open(wal, "r+b") as f:
            f.seek(wal_format.HEADER_SIZE + 2)
            f.write(b"\xff")
        deadline = time.monotonic() + 10
        while True:
            out = httpx.get(web.api("/api/transactions")).json()
            if out["health"] == "unhealthy" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert out["ok"] and out["reasons"][0]["code"] == "corrupt_wal"
        assert httpx.get(web.url).status_code == 200
        assert httpx.get(web.api("/api/history")).json()["ok"] is True
        assert web.proc.poll() is None


def test_ten_thousand_finished_transactions_are_paginated(root):
    hist = os.path.join(root, ".agent-tx", "history.jsonl")
    with open(hist, "w") as f:
        for i in range(10_000):
            f.write(json.dumps({"tid": f"tx-20260101-000000-{i:06x}", "state": "committed",
                                "label": f"h{i}", "created_at": "2026-01-01T00:00:00.000Z",
                                "ops": 1, "ended_at": "2026-01-01T00:00:01.000Z",
                                "files": ["a"], "code": None, "reason": None},
                               separators=(",", ":")) + "\n")
    with Web(root, "--port", "0") as web:
        t0 = time.perf_counter()
        first = httpx.get(web.api("/api/history?offset=0&limit=50")).json()
        last = httpx.get(web.api("/api/history?offset=9950&limit=50")).json()
        elapsed = time.perf_counter() - t0
        assert first["total"] == 10_000 and first["transactions"][0]["label"] == "h9999"
        assert last["transactions"][-1]["label"] == "h0"
        assert elapsed < 2.0, elapsed
        bad = httpx.get(web.api("/api/history?limit=100000"))
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "usage"


def test_without_the_monitor_extra_web_says_what_to_install(root):
    probe = ("import sys; sys.modules['uvicorn'] = None\n"
             "from agent_2pc.cli.main import main\n"
             "sys.exit(main(['--root', sys.argv[1], 'web', '--port', '0']))")
    proc = subprocess.run([sys.executable, "-c", probe, root], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "agent-2pc[monitor]" in proc.stderr and "[dependency_missing]" in proc.stderr
