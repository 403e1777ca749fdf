"""`agent-2pc web` in a real headless Chromium, as a user uses it: open the printed URL, watch
a transaction appear live, open it, read its diff and its check's log, abort it (actions
enabled); the page reconnects when the event stream drops; without the token, nothing."""

from __future__ import annotations

import socket
import time

import pytest
from conftest import write

from agent_2pc import Agent2PC

from .browser import launch, require_browser
from .webkit import Web

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def browser():
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        try:
            yield b
        finally:
            b.close()


def open_page(browser, url, ready="#health"):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector(ready, timeout=10_000)
    return page, errors


def test_a_user_watches_a_transaction_appear_opens_it_reads_its_diff_and_aborts_it(
        root, browser):
    write(root, "calc.py", "def add(a, b):\n    return a + b\n")
    with Web(root, "--port", "0", "--allow-actions") as web:
        page, errors = open_page(browser, web.url)
        page.wait_for_selector("#live.on", timeout=10_000)
        assert "No transaction in flight" in page.inner_text("main")
        client = Agent2PC(root)
        tx = client.begin(label="add sub()")
        tx.stage_write("calc.py", "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"
                                  "    return a - b\n")
        tx.savepoint("before-notes")
        tx.stage_write("NOTES.md", "# scratch\n")
        tx.rollback_to("before-notes")
        tx.stage_cmd("echo all 3 checks passed")
        # It appears without a reload, live.
        page.wait_for_selector(f'tr[data-tid="{tx.tid}"] >> text=1 passed', timeout=15_000)
        row = page.inner_text(f'tr[data-tid="{tx.tid}"]')
        assert "add sub()" in row and "active" in row
        # Open it: steps graph, diff with highlighting, the check's log.
        page.click(f'a[href="#/tx/{tx.tid}"]')
        page.wait_for_selector("#txid", timeout=15_000)
        assert page.inner_text("#txid") == tx.tid
        nodes = page.locator("#graph svg g.node")
        assert nodes.count() == 6  # begin, stage, savepoint, stage (undone), rollback, check
        assert page.locator("#graph svg path[marker-end]").count() == 1  # the rollback
        diff = page.inner_text("#diff")
        assert "+def sub(a, b):" in diff.replace("\u00a0", " ") or "def sub(a, b):" in diff
        assert page.locator("#diff .add").count() >= 3
        assert page.locator("#diff .tk-k").filter(has_text="def").count() >= 1
        assert "NOTES.md" not in diff  # rolled back
        page.click("details.log summary")
        # (The page's CSP forbids eval, so waits are locators, not wait_for_function.)
        page.locator("details.log pre", has_text="all 3 checks").wait_for(timeout=15_000)
        # Abort it from the page (a confirm dialog first).
        page.on("dialog", lambda d: d.accept())
        page.click("#abort")
        page.wait_for_selector(".txhead .pill.s-aborted", timeout=15_000)
        assert tx.state() == "aborted"
        assert page.locator("#abort").count() == 0
        # Back on the list, it is among the recently finished.
        page.click('nav a[data-nav="home"]')
        page.wait_for_selector(f'#recent a[href="#/tx/{tx.tid}"]', timeout=15_000)
        # Without the token: refused.
        assert page.request.get(web.base + "/api/transactions").status == 401
        assert page.request.get(web.base + "/static/app.js").status == 401
        page.goto(web.base + "/")
        assert "unauthorized" in page.content() and tx.tid not in page.content()
        assert errors == []


def test_read_only_pages_offer_no_actions(root, browser, client):
    tx = client.begin(label="look only")
    with Web(root, "--port", "0") as web:
        page, errors = open_page(browser, web.url + f"#/tx/{tx.tid}", ready="#txid")
        assert page.locator("#abort").count() == 0 and page.locator("#commit").count() == 0
        assert "Read-only" in page.inner_text("footer")
        assert errors == []


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_the_page_reconnects_when_the_event_stream_drops(root, browser, client):
    port = _free_port()
    env = {"AGENT2PC_WEB_TOKEN": "a-fixed-token-for-this-test-0123456789"}
    web = Web(root, "--port", str(port), env=env)
    try:
        page, errors = open_page(browser, web.url)
        page.wait_for_selector("#live.on", timeout=10_000)
        web.stop()  # the stream drops
        page.wait_for_selector("#live.off", timeout=10_000)
        web = Web(root, "--port", str(port), env=env)  # the same URL serves again
        tx = client.begin(label="after the drop")
        page.wait_for_selector(f'tr[data-tid="{tx.tid}"]', timeout=15_000)
        page.wait_for_selector("#live.on", timeout=15_000)
        assert errors == []
    finally:
        web.stop()


def test_history_pages_through_many_transactions(root, browser, client):
    for i in range(120):
        client.begin(label=f"old {i}").abort()
    with Web(root, "--port", "0") as web:
        page, _ = open_page(browser, web.url + "#/history", ready="#history")
        assert "page 1 of 3" in page.inner_text("main")
        assert page.locator("#history tbody tr").count() == 50
        assert "old 119" in page.inner_text("#history tbody tr:first-child")
        page.click("text=older →")
        page.locator("text=page 2 of 3").wait_for(timeout=15_000)
        t0 = time.monotonic()
        page.goto(web.url + "#/history?state=aborted&page=3")
        page.locator("text=page 3 of 3").wait_for(timeout=15_000)
        assert page.locator("#history tbody tr").count() == 20
        assert "old 0" in page.inner_text("#history tbody tr:last-child")
        assert time.monotonic() - t0 < 5
