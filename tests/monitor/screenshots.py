#!/usr/bin/env python3
"""Make the screenshots of docs/monitoring.md: a workspace where several agents work, the web
dashboard's pages in headless Chromium, and `top` rendered by rich (exported as SVG, shown in
the same browser).

    .venv/bin/python tests/monitor/screenshots.py docs/monitoring
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from api_server import Service  # noqa: E402
from browser import CHROMIUM, FLAGS  # noqa: E402
from webkit import Web  # noqa: E402

from agent_2pc import Agent2PC  # noqa: E402
from agent_2pc.errors import CheckFailed  # noqa: E402

CALC = '''"""A small calculator."""


def add(a, b):
    return a + b


def parse(text):
    # TODO: accept spaces
    left, op, right = text.partition("+")
    return add(int(left), int(right))
'''


def write(root: str, rel: str, text: str) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def build(root: str, service: Service) -> dict[str, str]:
    subprocess.run(["git", "init", "-q", root], check=True)
    write(root, "calc.py", CALC)
    write(root, "README.md", "# calc\n\nAdds numbers.\n")
    write(root, "web/app.js",
          "export function total(xs) {\n  return xs.reduce((a, b) => a + b, 0);\n}\n")
    write(root, "VERSION", "1.4.2\n")
    c = Agent2PC.init(root)
    labels = ["fix typo in README", "bump version", "add CHANGELOG entry", "lint: sort imports",
              "docs: usage example", "retry flaky test", "rename helper", "update lockfile"]
    for i in range(36):
        tx = c.begin(label=f"agent-{'abc'[i % 3]}: {labels[i % len(labels)]}")
        tx.stage_write(f"notes/n{i % 7}.md", f"note {i}\n")
        if i % 5 == 3:
            tx.abort(reason="the reviewer said no")
        else:
            tx.commit()
    paid = ""
    for i in range(3):  # API steps: fence entries with certificates
        tx = c.begin(label=f"agent-b: charge order #{1041 + i}")
        paid = tx.tid
        tx.stage_write(f"orders/{1041 + i}.json", '{"paid": true}\n')
        tx.stage_api("POST", f"{service.url}/charges", {"amount": 1999 + i, "order": 1041 + i},
                     compensate={"method": "POST", "url": f"{service.url}/refunds",
                                 "body": {"order": 1041 + i}})
        tx.commit()
    # In flight: a refactor with a savepoint, a rollback and two checks, one of them failing.
    main = c.begin(label="agent-a: parse() accepts spaces")
    main.record_read("README.md")
    main.stage_write("calc.py", CALC.replace("    # TODO: accept spaces\n", "").replace(
        'left, op, right = text.partition("+")',
        'left, op, right = text.replace(" ", "").partition("+")').replace(
        "def parse(text):", "def sub(a, b):\n    return a - b\n\n\ndef parse(text):"))
    main.savepoint("calc-done")
    main.stage_write("calc_test.py", "from calc import parse\n\nassert parse('1 + 2') == 4\n")
    try:
        main.stage_cmd("python3 calc_test.py")
    except CheckFailed:
        pass
    main.rollback_to("calc-done")
    main.stage_write("calc_test.py", "from calc import parse\n\n\ndef test_spaces():\n"
                                     "    assert parse('1 + 2') == 3\n\n\ntest_spaces()\n"
                                     "print('1 passed')\n")
    main.stage_replace("README.md", "Adds numbers.", "Adds numbers; `parse('1 + 2')` "
                                                     "accepts spaces.")
    main.stage_cmd("python3 calc_test.py")
    other = c.begin(label="agent-b: total() skips None")
    other.stage_write("web/app.js", "export function total(xs) {\n  // None-safe\n  return xs"
                                    ".filter((x) => x != null).reduce((a, b) => a + b, 0);\n}\n")
    third = c.begin(label="agent-c: bump to 1.5.0")
    third.stage_write("VERSION", "1.5.0\n")
    try:
        third.stage_cmd("grep -q 1.6 VERSION")
    except CheckFailed:
        pass
    c.begin(label="agent-c: release notes", timeout_ms=3_600_000).stage_write(
        "RELEASE.md", "## 1.5.0\n\n- parse() accepts spaces\n")
    return {"main": main.tid, "other": other.tid, "paid": paid}


def shoot(page, path: str, full: bool = True) -> None:
    if full:  # the whole page in one viewport (a full-page shot repeats the sticky header)
        height = page.evaluate("() => document.documentElement.scrollHeight")
        page.set_viewport_size({"width": page.viewport_size["width"], "height": height})
    page.evaluate("() => window.scrollTo(0, 0)")
    page.wait_for_timeout(100)
    page.screenshot(path=path)
    print("wrote", path)


def top_png(root: str, browser, out: str) -> None:
    from rich.console import Console

    from agent_2pc.cli.top import _Ui
    from agent_2pc.coordinator.monitor import Monitor

    console = Console(record=True, width=150, height=44, force_terminal=True,
                      color_system="truecolor", file=open(os.devnull, "w"))
    ui = _Ui(Monitor(root))
    console.print(ui.render(44, 150))
    svg = console.export_svg(title="agent-2pc top --watch")
    page = browser.new_page(viewport={"width": 1560, "height": 1060})
    page.set_content('<html><body style="margin:0;background:#0d1117">'
                     f'<div style="width:1560px">{svg}</div></body></html>')
    page.wait_for_timeout(300)
    page.locator("svg").screenshot(path=out)
    print("wrote", out)


def main() -> None:
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "docs/monitoring")
    os.makedirs(out, exist_ok=True)
    from playwright.sync_api import sync_playwright

    service = Service()
    root = os.path.realpath(tempfile.mkdtemp(prefix="a2pc-shots-")) + "/demo-repo"
    os.makedirs(root)
    tids = build(root, service)
    with Web(root, "--port", "0", "--allow-actions") as web, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(web.url)
        page.wait_for_selector("#live.on")
        time.sleep(0.5)
        shoot(page, os.path.join(out, "dashboard.png"), full=False)
        page.goto(web.url + f"#/tx/{tids['main']}")
        page.wait_for_selector("#diff")
        page.click("details.log summary")
        page.locator("details.log pre", has_text="1 passed").wait_for()
        shoot(page, os.path.join(out, "transaction.png"))
        page.set_viewport_size({"width": 1440, "height": 900})
        page.goto(web.url + f"#/tx/{tids['paid']}")
        page.wait_for_selector(".verdict.ok")
        shoot(page, os.path.join(out, "transaction-api.png"))
        page.set_viewport_size({"width": 1440, "height": 900})
        page.goto(web.url + "#/history")
        page.wait_for_selector("#history")
        shoot(page, os.path.join(out, "history.png"), full=False)
        page.goto(web.url + "#/ledger")
        page.wait_for_selector("#ledger")
        shoot(page, os.path.join(out, "ledger.png"), full=False)
        top_png(root, browser, os.path.join(out, "top.png"))
        # A commit whose process dies after the decision: the dashboard turns red.
        tx = Agent2PC(root).get(tids["other"])
        env = dict(os.environ, AGENT2PC_CRASH_AT="commit.after_decision")
        subprocess.run([sys.executable, "-m", "agent_2pc", "--root", root, "commit", "--tid",
                        tx.tid], env=env, capture_output=True)
        page.set_viewport_size({"width": 1440, "height": 900})
        page.goto(web.url + "#/")
        page.wait_for_selector(".health.unhealthy")
        time.sleep(0.3)
        shoot(page, os.path.join(out, "unhealthy.png"), full=False)
        browser.close()
    service.close()


if __name__ == "__main__":
    main()
