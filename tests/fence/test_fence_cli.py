"""``agent-2pc fence ...``: JSON in and out, exit statuses, tickets as JSON, start-up hygiene."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from agent_2pc.cli.main import main

pytestmark = pytest.mark.timeout(60)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(list(argv) + ["--json"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out  # exactly one JSON object on stdout
    return code, json.loads(lines[0])


@pytest.fixture
def store(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path}/cli-fence.db"


def test_cli_prepare_commit_then_replay_through_ticket_json(capsys: Any, store: str,
                                                            tmp_path: Any) -> None:
    args = ["--intent", "charge-1", "--domain", "acct:7", "--tool", "stripe.charge",
            "--args", '{"amount": 500}', "--agent", "agent-a", "--read", "acct:7@0"]
    code, res = cli(capsys, "fence", "prepare", *args, "--store", store)
    assert code == 0 and res["ok"] and res["status"] == "fresh"
    ticket_file = tmp_path / "prepare.json"
    ticket_file.write_text(json.dumps(res))  # the whole prepare output works as a ticket file
    code, again = cli(capsys, "fence", "prepare", *args, "--store", store)
    assert code == 1 and again["error"]["code"] == "intent_in_flight"
    code, hb = cli(capsys, "fence", "heartbeat", "--ticket", json.dumps(res["ticket"]),
                   "--store", store)
    assert code == 0 and hb["lease_expires_at"] >= res["lease_expires_at"]
    code, com = cli(capsys, "fence", "commit", "--ticket-file", str(ticket_file),
                    "--result", '{"charge": "ch_1"}', "--store", store)
    assert code == 0 and com["cert"]["seq"] == 1 and com["cert"]["result"] == {"charge": "ch_1"}
    code, rep = cli(capsys, "fence", "prepare", *args[:-2], "--agent", "agent-b",
                    "--store", store)
    assert code == 0 and rep["status"] == "already_done" and rep["cert"] == com["cert"]
    code, ab = cli(capsys, "fence", "abort", "--ticket-file", str(ticket_file), "--store", store)
    assert code == 0 and (ab["state"], ab["changed"]) == ("done", False)
    code, ver = cli(capsys, "fence", "verify", "--cert", json.dumps(com["cert"]))
    assert code == 0 and ver["valid"]
    code, st = cli(capsys, "fence", "status", "--store", store)
    assert code == 0 and st["states"]["done"] == 1
    assert st["counters"]["attempts"] == 3 and st["counters"]["refused"] == 1


def test_cli_refusals_exit_1_and_bad_input_exits_2(capsys: Any, store: str) -> None:
    forged = {"intent": "x", "generation": 1, "token": 1, "lease_id": "0" * 32,
              "fingerprint": "0" * 64}
    for ticket in (json.dumps(forged), "not json", "[]", '{"intent": "x"}'):
        code, res = cli(capsys, "fence", "commit", "--ticket", ticket, "--store", store)
        assert code == 1 and res["error"]["code"] == "stale_lease", res
    for argv in (["fence", "prepare", "--intent", "x", "--args", "{bad", "--store", store],
                 ["fence", "prepare", "--intent", "x", "--args", '{"a": NaN}', "--store", store],
                 ["fence", "prepare", "--intent", "x", "--read", "nodomain", "--store", store],
                 ["fence", "prepare", "--intent", "x", "--store", "ftp://nowhere"],
                 ["fence", "commit", "--store", store],
                 ["fence", "reconcile", "--intent", "x", "--action", "undo", "--store", store],
                 ["fence", "storm", "--attempts", "10", "--workers", "2", "--processes", "2",
                  "--store", "memory://"],
                 ["fence", "status", "--intent", "\udce9", "--store", store],
                 ["fence", "status", "--store", "sqlite:///no/such/dir/f.db"],
                 ["fence", "status", "--store", "postgresql://nobody@127.0.0.1:1/x"]):
        code, res = cli(capsys, *argv)
        assert code == 2 and not res["ok"], (argv, res)


def test_cli_store_that_is_not_a_database_is_unavailable(capsys: Any, tmp_path: Any) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    code, res = cli(capsys, "fence", "status", "--store", f"sqlite:///{junk}")
    assert code == 2 and res["error"]["code"] == "store_unavailable"
    assert junk.read_bytes() == b"this is not a database" * 100


def test_cli_status_never_prints_a_store_password() -> None:
    from agent_2pc.fence._fence import redact

    assert redact("postgresql://u:s3cret@h:5432/db?x=1") == "postgresql://u:***@h:5432/db?x=1"
    assert redact("sqlite:///a/b.db") == "sqlite:///a/b.db"


def test_cli_unknown_outcome_is_fenced_until_reconcile(capsys: Any, store: str) -> None:
    code, res = cli(capsys, "fence", "prepare", "--intent", "pay", "--store", store)
    ticket = json.dumps(res["ticket"])
    code, ab = cli(capsys, "fence", "abort", "--ticket", ticket, "--outcome", "unknown",
                   "--reason", "timeout", "--store", store)
    assert code == 0 and ab["state"] == "fenced"
    code, res = cli(capsys, "fence", "prepare", "--intent", "pay", "--store", store)
    assert code == 1 and res["error"]["code"] == "intent_fenced"
    code, st = cli(capsys, "fence", "status", "--intent", "pay", "--store", store)
    assert st["state"] == "fenced" and st["reason"] == "timeout"
    code, rec = cli(capsys, "fence", "reconcile", "--intent", "pay", "--action", "done",
                    "--result", '"it happened"', "--store", store)
    assert code == 0 and rec["state"] == "done" and rec["cert"]["result"] == "it happened"
    code, ver = cli(capsys, "fence", "verify", "--intent", "pay", "--chain", "--store", store)
    assert code == 0 and ver["valid"] and ver["length"] == 1


def test_cli_verify_detects_tampering(capsys: Any, store: str) -> None:
    code, res = cli(capsys, "fence", "prepare", "--intent", "v", "--args", "[1]",
                    "--store", store)
    code, com = cli(capsys, "fence", "commit", "--ticket", json.dumps(res["ticket"]),
                    "--result", "1", "--store", store)
    tampered = dict(com["cert"], result=2)
    code, ver = cli(capsys, "fence", "verify", "--cert", json.dumps(tampered))
    assert code == 1 and ver["error"]["code"] == "invalid_certificate" and not ver["valid"]
    assert ver["problems"] == ["hash does not match the content"]


def test_cli_verify_with_a_key_refuses_a_certificate_stripped_of_its_signature(
        capsys: Any, store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    from agent_2pc.fence._canon import canonical

    monkeypatch.setenv("AGENT2PC_FENCE_HMAC_KEY", "the key")
    code, res = cli(capsys, "fence", "prepare", "--intent", "pay", "--args", "[1]",
                    "--store", store)
    code, com = cli(capsys, "fence", "commit", "--ticket", json.dumps(res["ticket"]),
                    "--result", '{"paid": 1}', "--store", store)
    assert code == 0 and com["cert"]["signature"].startswith("hmac-sha256:")
    forged = {k: v for k, v in com["cert"].items() if k not in ("hash", "signature")}
    forged["result"] = {"paid": 1000}
    forged["hash"] = hashlib.sha256(canonical(
        {k: v for k, v in forged.items() if k != "hash"})).hexdigest()
    code, ver = cli(capsys, "fence", "verify", "--cert", json.dumps(forged))
    assert code == 1 and ver["error"]["code"] == "invalid_certificate", ver
    assert not ver["valid"] and not ver["signed"]
    assert any("unsigned" in p for p in ver["problems"]), ver
    code, ver = cli(capsys, "fence", "verify", "--cert", json.dumps(com["cert"]))
    assert code == 0 and ver["valid"] and ver["signed"]
    monkeypatch.setenv("AGENT2PC_FENCE_HMAC_KEY", "another key")
    code, ver = cli(capsys, "fence", "verify", "--cert", json.dumps(com["cert"]))
    assert code == 1 and ver["problems"] == ["signature does not match"], ver


def test_cli_default_store_lives_in_the_workspace(capsys: Any, tmp_path: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT2PC_FENCE_STORE", raising=False)
    monkeypatch.delenv("AGENT2PC_ROOT", raising=False)
    code, res = cli(capsys, "--root", str(tmp_path), "fence", "status")
    assert code == 2 and res["error"]["code"] == "not_initialized"
    from agent_2pc.storage.workspace import init

    init(str(tmp_path))  # a workspace made here (a bare .agent-tx/ is untrusted_workspace)
    code, res = cli(capsys, "--root", str(tmp_path), "fence", "status")
    assert code == 0 and res["store"] == f"sqlite:///{tmp_path}/.agent-tx/fence.db".replace(
        "sqlite:////", "sqlite:///")
    assert (tmp_path / ".agent-tx" / "fence.db").exists()


def test_cli_storm_counts_executions_from_the_side_effect(capsys: Any, store: str,
                                                          tmp_path: Any) -> None:
    effects = tmp_path / "effects.log"
    code, res = cli(capsys, "fence", "storm", "--attempts", "120", "--workers", "4",
                    "--processes", "2", "--store", store, "--effect-file", str(effects))
    assert code == 0 and res["ok"]
    assert {"executions", "replayed", "refused", "elapsed_ms"} <= set(res)
    assert res["executions"] == 1 == len(effects.read_text().splitlines())
    assert res["replayed"] + res["refused"] + res["admitted"] == 120


def test_cli_module_is_declarative_and_sqlite_does_not_import_psycopg(tmp_path: Any) -> None:
    probe = (
        "import sys, json\n"
        "import agent_2pc.cli.fence\n"
        "before = sorted(m for m in sys.modules if m.startswith('agent_2pc.fence')\n"
        "                or m in ('sqlite3', 'psycopg', 'rfc8785'))\n"
        "from agent_2pc.fence import open_fence, EffectRequest\n"
        f"f = open_fence('sqlite:///{tmp_path}/p.db')\n"
        "f.commit(f.prepare(EffectRequest(intent='x', args={'a': 1})).ticket, 1)\n"
        "f.close()\n"
        "print(json.dumps([before, 'psycopg' in sys.modules, 'rfc8785' in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert out.returncode == 0, out.stderr
    before, psycopg_loaded, rfc8785_loaded = json.loads(out.stdout)
    assert before == [] and not psycopg_loaded and not rfc8785_loaded


def test_cli_through_a_real_process(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path}/proc.db"
    run = [sys.executable, "-m", "agent_2pc", "fence"]
    p = subprocess.run(run + ["prepare", "--intent", "p", "--store", store, "--json"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    ticket = json.loads(p.stdout)["ticket"]
    p = subprocess.run(run + ["commit", "--ticket-file", "-", "--store", store],
                       input=json.dumps(ticket), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "cert" in p.stdout, p.stderr
    p = subprocess.run(run + ["prepare", "--intent", "p", "--store", store],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("already done")
