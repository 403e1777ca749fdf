// agent-2pc web: the page. A hash router over four views (transactions, one transaction,
// history, fence ledger), live through server-sent events. Every request carries the token;
// commit and abort also carry the CSRF token of this page.
"use strict";
(function () {
  const meta = n => (document.querySelector('meta[name="' + n + '"]') || {}).content || "";
  const TOKEN = meta("a2pc-token"), CSRF = meta("a2pc-csrf"), ACTIONS = meta("a2pc-actions") === "1";
  const esc = window.A2Highlight.esc;
  const view = document.getElementById("view");
  const live = document.getElementById("live");
  const state = { snap: null, sort: { key: "age_s", dir: -1 }, seen: new Set(), es: null,
    lastEvent: 0, route: null, txTimer: null, txVersion: "" };

  document.getElementById("mode").textContent = ACTIONS
    ? "Actions enabled: commit and abort are offered on live transactions."
    : "Read-only: start with --allow-actions to commit or abort from here.";

  // -- helpers --------------------------------------------------------------------------------
  async function api(path, opts) {
    opts = opts || {};
    const headers = Object.assign({ "X-Agent2PC-Token": TOKEN }, opts.headers || {});
    const r = await fetch(path, Object.assign({}, opts, { headers: headers, cache: "no-store" }));
    let body;
    try { body = await r.json(); } catch (e) { body = { ok: false, error: { code: "http_" + r.status, message: r.statusText } }; }
    return body;
  }
  function size(n) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return i ? n.toFixed(1) + " " + u[i] : n + " B";
  }
  function age(s) {
    if (s === null || s === undefined) return "–";
    s = Math.max(0, Math.floor(s));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d " + Math.floor(s % 86400 / 3600) + "h";
  }
  function when(iso) {
    if (!iso) return "–";
    const d = new Date(iso), s = (Date.now() - d.getTime()) / 1000;
    return '<span title="' + esc(iso) + '">' + (s < 0 ? "in " + age(-s) : age(s) + " ago") + "</span>";
  }
  const pill = st => '<span class="pill s-' + esc(st) + '">' + esc(st) + "</span>";
  const txLink = tid => '<a class="mono" href="#/tx/' + encodeURIComponent(tid) + '">' + esc(tid) + "</a>";
  function toast(text, bad) {
    const t = document.createElement("div");
    t.className = "toast" + (bad ? " bad" : ""); t.textContent = text;
    document.body.appendChild(t); setTimeout(() => t.remove(), 4000);
  }
  function checksCell(r) {
    const c = r.checks || {}, out = [];
    if (r.runs && r.runs.length) out.push('<span class="tag warn">' + r.runs.length + " running</span>");
    if (c.failed) out.push('<span class="tag">' + c.failed + " failed</span>");
    if (c.passed) out.push('<span class="tag ok">' + c.passed + " passed</span>");
    if (c.stale) out.push('<span class="tag warn">' + c.stale + " stale</span>");
    return out.join("") || '<span class="muted">–</span>';
  }

  // -- live updates ---------------------------------------------------------------------------
  function connect() {
    if (state.es) state.es.close();
    const es = new EventSource("/api/events?token=" + encodeURIComponent(TOKEN));
    state.es = es;
    es.addEventListener("snapshot", ev => {
      state.lastEvent = Date.now();
      live.className = "live on"; live.textContent = "live";
      let snap;
      try { snap = JSON.parse(ev.data); } catch (e) { return; }
      onSnapshot(snap);
    });
    es.onopen = () => { state.lastEvent = Date.now(); };
    es.onerror = () => {
      live.className = "live off"; live.textContent = "reconnecting";
      if (es.readyState === EventSource.CLOSED) setTimeout(connect, 1500);
    };
  }
  // A stream that went silent (a proxy, a sleeping laptop): start a new one.
  setInterval(() => {
    if (state.lastEvent && Date.now() - state.lastEvent > 8000) {
      live.className = "live off"; live.textContent = "reconnecting";
      state.lastEvent = Date.now(); connect();
    }
  }, 2000);

  function onSnapshot(snap) {
    state.snap = snap;
    if (snap.root) document.getElementById("root").textContent = snap.root;
    const r = state.route;
    if (!r || r.name === "home") renderHome();
    else if (r.name === "tx") {
      const row = (snap.in_flight || []).find(x => x.tid === r.tid);
      const v = row ? row.state + ":" + row.ops + ":" + (row.checks || {}).passed + ":" + (row.checks || {}).failed + ":" + row.holder + ":" + (row.runs || []).length : "gone";
      if (v !== state.txVersion) { state.txVersion = v; scheduleTx(r.tid); }
    }
  }

  // -- the transactions view ------------------------------------------------------------------
  const COLS = [
    ["tid", "Transaction"], ["label", "Label"], ["state", "State"], ["age_s", "Age"],
    ["files_total", "Files"], ["checks", "Checks"], ["effects", "API"], ["expires_in_s", "Deadline"],
    ["holder", "Holder"],
  ];
  function sortRows(rows) {
    const { key, dir } = state.sort;
    const val = r => key === "checks" ? ((r.checks || {}).failed * 1000 + (r.checks || {}).passed) : r[key];
    return rows.slice().sort((a, b) => {
      const x = val(a), y = val(b);
      if (x === y) return a.tid < b.tid ? -1 : 1;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * dir;
    });
  }
  function renderHome() {
    const s = state.snap;
    if (!s) { view.innerHTML = '<p class="muted">Waiting for the first snapshot…</p>'; return; }
    if (s.ok === false) {
      view.innerHTML = '<div class="health unhealthy"><span class="badge">ERROR</span><div>' + esc(s.error.code + ": " + s.error.message) + "</div></div>";
      return;
    }
    const w = s.wal, c = s.counts, fence = s.fence || {};
    let h = '<div class="health ' + esc(s.health) + '" id="health"><span class="badge">' + esc(s.health.toUpperCase()) + "</span><div>";
    if (!s.reasons.length) h += '<div>Every transaction is accounted for; the log verifies end to end.</div>';
    else h += '<ul class="reasons">' + s.reasons.map(r => '<li><span class="code">' + esc(r.code) + "</span>" + esc(r.message) + "</li>").join("") + "</ul>";
    h += "</div></div>";
    const rec = s.last_recovery;
    h += '<div class="cards">' +
      card("Write-ahead log", size(w.bytes), w.records + " records, " + (w.verified ? "CRC32 verified" : (w.damage && w.damage.torn ? "torn tail at " : "damaged at ") + (w.damage ? w.damage.offset : ""))) +
      card("Scratch in flight", size(s.scratch.bytes), s.scratch.entries + " entries under .agent-tx/tx/") +
      card("Staged blobs", size(s.blobs.bytes), s.blobs.count + " named by live transactions") +
      (s.disk ? card("Disk free", size(s.disk.free_bytes), (s.disk.free_ratio * 100).toFixed(1) + "% of " + size(s.disk.total_bytes)) : "") +
      card("Fence", fence.present ? (fence.error ? "error" : (fence.counters ? fence.counters.attempts + " attempts" : "–")) : "none",
        fence.present && fence.states ? Object.entries(fence.states).map(([k, v]) => v + " " + k).join(", ") : "no API step yet") +
      card("Last recovery", rec ? rec.kind.replace(/_/g, " ") : "none", rec ? when(rec.at) + (rec.tid ? " · " + esc(rec.tid) : "") : "nothing recovered on record") +
      "</div>";
    h += '<div class="countbar">' + ["active", "preparing", "committing", "aborting", "committed", "aborted"]
      .filter(k => k === "active" || k === "committed" || k === "aborted" || c[k])
      .map(k => '<span class="c"><b>' + c[k] + "</b>" + pill(k) + "</span>").join("") +
      '<span class="c"><b>' + c.total + "</b>in all</span></div>";
    const rows = sortRows(s.in_flight);
    h += '<h2>In flight <span class="count">' + rows.length + "</span></h2>";
    if (!rows.length) h += '<div class="empty">No transaction in flight.</div>';
    else {
      h += '<table id="inflight"><thead><tr>' + COLS.map(([k, t]) =>
        '<th class="sort" data-key="' + k + '">' + t + (state.sort.key === k ? '<span class="arrow">' + (state.sort.dir > 0 ? "▲" : "▼") + "</span>" : "") + "</th>").join("") + "</tr></thead><tbody>";
      const seen = new Set();
      for (const r of rows) {
        seen.add(r.tid);
        const cls = (r.stuck ? "stuck " : "") + (state.seen.size && !state.seen.has(r.tid) ? "new" : "");
        h += '<tr class="' + cls + '" data-tid="' + esc(r.tid) + '"><td>' + txLink(r.tid) + (r.stuck ? '<span class="tag">stuck</span>' : "") + "</td>" +
          '<td class="trunc">' + esc(r.label || "") + "</td><td>" + pill(r.state) + '</td><td class="num">' + age(r.age_s) +
          '</td><td class="num">' + r.files_total + "</td><td>" + checksCell(r) + '</td><td class="num">' + (r.effects || "–") +
          "</td><td>" + (r.deadline ? when(r.deadline) : '<span class="muted">none</span>') + "</td><td>" +
          (r.holder === "dead" ? '<span class="tag">dead</span>' : r.holder === "working" ? '<span class="tag ok">working</span>' : '<span class="muted">idle</span>') + "</td></tr>";
      }
      h += "</tbody></table>";
      state.seen = seen;
    }
    if (s.stuck.length) {
      h += '<h2>Stuck <span class="count">' + s.stuck.length + "</span></h2><table><tbody>" +
        s.stuck.map(x => "<tr><td>" + txLink(x.tid) + "</td><td>" + pill(x.state) + "</td><td>" + esc(x.why) + "</td></tr>").join("") + "</tbody></table>";
    }
    h += '<h2>Recently finished <span class="count"><a href="#/history">all history →</a></span></h2>';
    if (!s.recent.length) h += '<div class="empty">Nothing finished yet.</div>';
    else h += finishedTable(s.recent, "recent");
    view.innerHTML = h;
    if (!state.seen.size) state.seen = new Set(rows.map(r => r.tid));
    view.querySelectorAll("th.sort").forEach(th => th.addEventListener("click", () => {
      const k = th.dataset.key;
      state.sort = { key: k, dir: state.sort.key === k ? -state.sort.dir : (k === "tid" || k === "label" || k === "state" ? 1 : -1) };
      renderHome();
    }));
  }
  function card(k, v, sub) {
    return '<div class="card"><div class="k">' + esc(k) + '</div><div class="v">' + esc(v) + '</div><div class="s">' + sub + "</div></div>";
  }
  function finishedTable(rows, id) {
    return '<table id="' + id + '"><thead><tr><th>Transaction</th><th>Label</th><th>State</th><th>Ended</th><th>Files</th><th>Why</th></tr></thead><tbody>' +
      rows.map(r => "<tr><td>" + txLink(r.tid) + '</td><td class="trunc">' + esc(r.label || "") + "</td><td>" + pill(r.state) +
        "</td><td>" + when(r.ended_at) + '</td><td class="num">' + (r.files || []).length + '</td><td class="trunc">' +
        (r.state === "aborted" ? '<span class="mono">' + esc(r.code || "") + "</span> " + esc(r.reason || "") : "") +
        (r.uncompensated ? '<span class="tag">uncompensated</span>' : "") + "</td></tr>").join("") + "</tbody></table>";
  }

  // -- one transaction ------------------------------------------------------------------------
  function scheduleTx(tid) {
    clearTimeout(state.txTimer);
    state.txTimer = setTimeout(() => { if (state.route && state.route.tid === tid) renderTx(tid, true); }, 250);
  }
  async function renderTx(tid, refresh) {
    const [t, d] = await Promise.all([api("/api/transactions/" + encodeURIComponent(tid)),
      api("/api/transactions/" + encodeURIComponent(tid) + "/diff")]);
    if (!state.route || state.route.tid !== tid) return;
    if (!t.ok) { view.innerHTML = '<div class="banner">' + esc(t.error.code + ": " + t.error.message) + '</div><p><a href="#/">← back</a></p>'; return; }
    const openLogs = new Set([...view.querySelectorAll("details.log[open]")].map(e => e.dataset.n));
    const scroll = window.scrollY;
    let h = '<p><a href="#/">← transactions</a></p><div class="txhead"><span class="tid" id="txid">' + esc(t.tid) + "</span>" + pill(t.state) +
      (t.label ? '<span class="label">' + esc(t.label) + "</span>" : "");
    if (ACTIONS && t.live && t.state === "active") {
      h += '<span class="actions"><button class="primary" id="commit">Commit</button><button class="danger" id="abort">Abort</button></span>';
    }
    h += "</div>";
    if (t.stuck) h += '<div class="banner"><b>Stuck:</b> ' + esc(t.stuck) + "</div>";
    if (t.state === "aborted" && t.reason) h += '<div class="banner info"><b>Aborted</b> (<span class="mono">' + esc(t.code || "") + "</span>): " + esc(t.reason) + "</div>";
    h += '<div class="kv">' + kv("Created", when(t.created_at)) +
      (t.live ? kv("Age", age(t.age_s)) + kv("Deadline", t.deadline ? when(t.deadline) : "none") + kv("Holder", esc(t.holder)) : kv("Ended", when(t.ended_at))) +
      kv("Files", String((t.changes || t.files || []).length)) + kv("Steps", String((t.steps || []).length)) +
      kv("Savepoints", (t.savepoints || []).map(s => esc(s.name || s)).join(", ") || "none") + "</div>";
    if (!t.in_log) {
      h += '<div class="banner info">This transaction was compacted out of the log: its summary is kept in history.jsonl, its steps are not.</div>';
      h += '<h2>Files</h2>' + ((t.files || []).length ? '<div class="filelist">' + t.files.map(f => '<span class="f">' + esc(f) + "</span>").join("") + "</div>" : '<div class="empty">No file changed.</div>');
    } else {
      h += '<h2>Steps and savepoints</h2><div class="graphbox" id="graph"></div><div class="legend">' +
        [["begin", "begin"], ["stage", "stage / passed check"], ["bad", "delete / failed check / abort"], ["save", "savepoint"], ["roll", "rollback"], ["api", "API call / prepare"], ["commit", "commit decision"]]
          .map(([c, t]) => '<span><i class="lg-' + c + '"></i>' + t + "</span>").join("") + '<span><i class="lg-undone"></i>undone by a rollback</span></div>';
      h += '<h2>Staged diff <span class="count">' + (d.ok ? d.files.length + " file(s)" : "") + "</span></h2>";
      if (!d.ok) h += '<div class="banner">' + esc(d.error.message) + "</div>";
      else if (d.finished) h += '<div class="empty">The transaction is finished: its changes are ' + (t.state === "committed" ? "in the tree" : "gone") + ".</div>";
      else if (!d.files.length) h += '<div class="empty">Nothing staged.</div>';
      else {
        h += '<div class="filelist">' + d.files.map(f => '<span class="f">' + esc(f.path) + '<span class="a">+' + f.additions + '</span><span class="d">−' + f.deletions + "</span></span>").join("") + "</div>";
        h += '<div class="diff" id="diff"><pre>' + window.A2Highlight.diff(d.diff) + "</pre></div>";
      }
      h += '<h2>Checks <span class="count">' + (t.checks || []).length + "</span></h2>";
      if (!(t.checks || []).length) h += '<div class="empty">No check recorded' + ((t.runs || []).length ? " yet (one is running)" : "") + ".</div>";
      else h += "<table><thead><tr><th>Command</th><th>Result</th><th>Exit</th><th>Time</th><th>Isolation</th><th>Log</th></tr></thead><tbody>" +
        t.checks.map((c, i) => "<tr><td class=\"mono\">" + esc(Array.isArray(c.command) ? c.command.join(" ") : c.command) + "</td><td>" +
          (c.passed ? '<span class="tag ok">passed</span>' : '<span class="tag">' + (c.timed_out ? "timed out" : "failed") + "</span>") + (c.stale ? '<span class="tag warn">stale</span>' : "") +
          '</td><td class="num">' + esc(String(c.exit_code)) + '</td><td class="num">' + (c.duration_ms != null ? Math.round(c.duration_ms) + " ms" : "–") + "</td><td>" + esc(c.isolation || "") +
          '</td><td><details class="log" data-n="' + i + '"><summary>show</summary><pre>…</pre></details></td></tr>').join("") + "</tbody></table>";
      if ((t.runs || []).length) h += '<p class="muted">A staged view is open (a check, exec or look is running) since ' + t.runs.map(r => when(r.since)).join(", ") + ".</p>";
    }
    const effects = t.effects || [];
    h += '<h2>API steps and fence certificates <span class="count">' + effects.length + "</span></h2>";
    if (!effects.length) h += '<div class="empty">No API step.</div>';
    else h += "<table><thead><tr><th>#</th><th>Call</th><th>Outcome</th><th>Idempotency key</th><th>Fence</th><th>Certificate</th></tr></thead><tbody>" +
      effects.map(e => "<tr><td>" + e.n + '</td><td class="mono trunc">' + esc(e.method + " " + e.url) + "</td><td>" + esc(e.outcome) + (e.status ? " (" + e.status + ")" : "") +
        (e.compensation ? '<br><span class="muted">compensation: ' + esc(e.compensation.outcome) + "</span>" : "") +
        '</td><td class="mono trunc">' + esc(e.idempotency_key) + "</td><td>" + (e.fence ? esc(e.fence.state) + (e.fence.token ? ' <span class="muted">token ' + e.fence.token + "</span>" : "") : "–") +
        "</td><td>" + certCell(e.fence) + "</td></tr>").join("") + "</tbody></table>";
    view.innerHTML = h;
    if (t.in_log) document.getElementById("graph").appendChild(window.A2Graph.draw(t.steps || []));
    view.querySelectorAll("details.log").forEach(det => {
      det.addEventListener("toggle", () => { if (det.open) loadLog(tid, det); });
      if (openLogs.has(det.dataset.n)) { det.open = true; }
    });
    const b1 = document.getElementById("abort"), b2 = document.getElementById("commit");
    if (b1) b1.addEventListener("click", () => act(tid, "abort"));
    if (b2) b2.addEventListener("click", () => act(tid, "commit"));
    if (refresh) window.scrollTo(0, scroll);
  }
  function kv(k, v) { return '<div><div class="k">' + esc(k) + '</div><div class="v">' + v + "</div></div>"; }
  function certCell(f) {
    if (!f || !f.cert) return '<span class="muted">none</span>';
    return f.verified ? '<span class="verdict ok" title="hash checked by the server">✓ verified</span> <span class="mono muted">' + esc(String(f.cert.hash).slice(0, 12)) + "…</span>"
      : '<span class="verdict bad">✗ ' + esc((f.problems || []).join("; ")) + "</span>";
  }
  async function loadLog(tid, det) {
    const r = await api("/api/transactions/" + encodeURIComponent(tid) + "/checks/" + det.dataset.n + "/log");
    det.querySelector("pre").textContent = r.ok ? (r.truncated ? "… (last " + size(r.text.length) + " of " + size(r.bytes) + ")\n" : "") + (r.text || (r.missing ? "(log gone: " + r.missing + ")" : "(empty)")) : r.error.message;
  }
  async function act(tid, action) {
    const what = action === "abort" ? "Abort " + tid + "? Nothing it staged will reach the tree." : "Commit " + tid + "? Its staged changes will be applied to the tree.";
    if (!window.confirm(what)) return;
    const r = await api("/api/transactions/" + encodeURIComponent(tid) + "/" + action,
      { method: "POST", headers: { "X-CSRF-Token": CSRF, "Content-Type": "application/json" }, body: "{}" });
    if (r.ok) toast(tid + " " + r.state);
    else toast(action + " refused: " + (r.error ? r.error.code + ": " + r.error.message : "?"), true);
    renderTx(tid, true);
  }

  // -- history and ledger ---------------------------------------------------------------------
  const PAGE = 50;
  async function renderHistory(q) {
    const page = Math.max(1, parseInt(q.get("page") || "1", 10) || 1), st = q.get("state") || "";
    const r = await api("/api/history?offset=" + (page - 1) * PAGE + "&limit=" + PAGE + (st ? "&state=" + st : ""));
    if (state.route.name !== "history") return;
    if (!r.ok) { view.innerHTML = '<div class="banner">' + esc(r.error.message) + "</div>"; return; }
    const pages = Math.max(1, Math.ceil(r.total / PAGE));
    let h = '<h1>History</h1><p class="muted">Finished transactions, newest first: ' + r.total + " in all.</p>";
    h += '<div class="filters">' + [["", "all"], ["committed", "committed"], ["aborted", "aborted"]].map(([v, t]) =>
      '<a class="' + (st === v ? "on" : "") + '" href="#/history?state=' + v + '">' + t + "</a>").join("") + "</div><br>";
    h += r.transactions.length ? finishedTable(r.transactions, "history") : '<div class="empty">Nothing here.</div>';
    h += pager("#/history?state=" + st + "&page=", page, pages);
    view.innerHTML = h;
  }
  async function renderLedger(q) {
    const page = Math.max(1, parseInt(q.get("page") || "1", 10) || 1);
    const r = await api("/api/ledger?offset=" + (page - 1) * PAGE + "&limit=" + PAGE);
    if (state.route.name !== "ledger") return;
    if (!r.ok) { view.innerHTML = '<div class="banner">' + esc(r.error.message) + "</div>"; return; }
    let h = "<h1>Fence ledger</h1>";
    if (!r.present) { view.innerHTML = h + '<div class="empty">No fence store in this workspace yet (no API step was ever prepared).</div>'; return; }
    const c = r.counters || {};
    h += '<div class="cards">' + Object.entries(r.states).map(([k, v]) => card(k, String(v), "entries")).join("") +
      card("attempts", String(c.attempts || 0), (c.admitted || 0) + " admitted, " + (c.replayed || 0) + " replayed, " + (c.refused || 0) + " refused") + "</div>";
    h += '<h2>Entries <span class="count">' + r.total + " — certificates verified by the server</span></h2>";
    h += r.entries.length ? "<table id=\"ledger\"><thead><tr><th>Intent</th><th>State</th><th>Tool</th><th>Domain</th><th>Token</th><th>Updated</th><th>Certificate</th></tr></thead><tbody>" +
      r.entries.map(e => '<tr><td class="mono trunc">' + esc(e.intent) + "</td><td>" + esc(e.state) + (e.reason ? '<br><span class="muted">' + esc(e.reason) + "</span>" : "") +
        "</td><td>" + esc(e.tool || "") + "</td><td>" + esc(e.domain || "") + '</td><td class="num">' + e.token + "</td><td>" + when(e.updated_at) +
        "</td><td>" + certCell(e) + "</td></tr>").join("") + "</tbody></table>" : '<div class="empty">The ledger is empty.</div>';
    h += pager("#/ledger?page=", page, Math.max(1, Math.ceil(r.total / PAGE)));
    view.innerHTML = h;
  }
  function pager(href, page, pages) {
    return '<div class="pager">' + (page > 1 ? '<a class="btn" href="' + href + (page - 1) + '">← newer</a>' : '<button disabled>← newer</button>') +
      "<span>page " + page + " of " + pages + "</span>" +
      (page < pages ? '<a class="btn" href="' + href + (page + 1) + '">older →</a>' : '<button disabled>older →</button>') + "</div>";
  }

  // -- routing --------------------------------------------------------------------------------
  function route() {
    const hash = location.hash.replace(/^#/, "") || "/";
    const [path, qs] = hash.split("?");
    const q = new URLSearchParams(qs || "");
    let r;
    if (path.startsWith("/tx/")) r = { name: "tx", tid: decodeURIComponent(path.slice(4)) };
    else if (path === "/history") r = { name: "history" };
    else if (path === "/ledger") r = { name: "ledger" };
    else r = { name: "home" };
    state.route = r; state.txVersion = "";
    document.querySelectorAll("nav a").forEach(a => a.classList.toggle("on",
      a.dataset.nav === (r.name === "tx" ? "home" : r.name)));
    window.scrollTo(0, 0);
    if (r.name === "home") { state.seen = new Set(); renderHome(); }
    else if (r.name === "tx") { view.innerHTML = '<p class="muted">Loading…</p>'; renderTx(r.tid, false); }
    else if (r.name === "history") renderHistory(q);
    else renderLedger(q);
  }
  window.addEventListener("hashchange", route);
  route();
  connect();
})();
