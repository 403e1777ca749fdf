// A transaction's steps as a graph (SVG, drawn here): one node per log record, in order, on
// the main line; the steps a rollback undid branch off below it, and the rollback's arrow goes
// back to the savepoint it returned to. Savepoints are diamonds.
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const COL = 90, LANE0 = 62, LANE1 = 150, LEFT = 48, MAX_STEPS = 400;
  const COLORS = {
    begin: "#58a6ff", read: "#8b949e", stage: "#3fb950", effect: "#bc8cff", check: "#3fb950",
    savepoint: "#d29922", rollback: "#db6d28", prepare: "#bc8cff", decision: "#39c5cf",
    result: "#bc8cff", end: "#3fb950",
  };

  function el(name, attrs, text) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function short(s, n) { s = String(s == null ? "" : s); return s.length > n ? s.slice(0, n - 1) + "…" : s; }
  function base(p) { p = String(p || ""); const i = p.lastIndexOf("/"); return i >= 0 ? p.slice(i + 1) : p; }

  function colorOf(s) {
    if (s.type === "stage" && s.op === "delete") return "#f85149";
    if (s.type === "check") return s.passed ? "#3fb950" : "#f85149";
    if (s.type === "decision") return s.outcome === "commit" ? "#39c5cf" : "#f85149";
    if (s.type === "end") return s.state === "committed" ? "#3fb950" : "#f85149";
    if (s.type === "result") return s.outcome === "done" ? "#bc8cff" : "#f85149";
    return COLORS[s.type] || "#8b949e";
  }
  function detail(s) {
    switch (s.type) {
      case "begin": return s.label || "";
      case "stage": return (s.op === "write" ? "" : s.op + " ") + base(s.path);
      case "read": return base(s.path);
      case "check": return (s.passed ? "✓ " : "✗ ") + (Array.isArray(s.command) ? s.command.join(" ") : s.command);
      case "savepoint": case "rollback": return s.name;
      case "effect": return (s.method || "") + " " + (s.url || "").replace(/^https?:\/\//, "");
      case "decision": return s.outcome + (s.code ? " (" + s.code + ")" : "");
      case "result": return s.phase + " " + s.outcome;
      case "end": return s.state;
      case "prepare": return "pid " + (s.pid || "?");
    }
    return "";
  }
  function title(s) {
    const parts = ["#" + s.n + " " + s.type, s.at || ""];
    for (const k of ["label", "path", "op", "via", "size", "name", "command", "exit_code", "method", "url", "outcome", "code", "reason", "state", "pid"]) {
      if (s[k] !== undefined && s[k] !== null && s[k] !== "") parts.push(k + ": " + (Array.isArray(s[k]) ? s[k].join(" ") : s[k]));
    }
    if (s.undone_by !== undefined) parts.push("undone by the rollback at #" + s.undone_by);
    return parts.join("\n");
  }

  function draw(steps) {
    const shown = steps.slice(0, MAX_STEPS);
    const lane = shown.map(s => (s.undone_by !== undefined || s.type === "rollback") ? 1 : 0);
    const x = i => LEFT + i * COL;
    const y = i => lane[i] ? LANE1 : LANE0;
    const width = LEFT * 2 + Math.max(shown.length - 1, 1) * COL;
    const height = lane.some(l => l) ? 206 : 84;
    const svg = el("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height, role: "img",
      "aria-label": "steps of the transaction" });
    const defs = el("defs", {});
    const marker = el("marker", { id: "arr", viewBox: "0 0 10 10", refX: 8, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
    marker.appendChild(el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#db6d28" }));
    defs.appendChild(marker);
    svg.appendChild(defs);
    const edges = el("g", {}), nodes = el("g", {});
    svg.appendChild(edges); svg.appendChild(nodes);
    let lastMain = -1, lastBranch = -1;
    shown.forEach((s, i) => {
      // the edge into this step
      let from = -1;
      if (lane[i] === 0) from = lastMain;
      else from = (lastBranch >= 0 && lastBranch > lastMain) ? lastBranch : lastMain;
      if (from >= 0) {
        const x1 = x(from), y1 = y(from), x2 = x(i), y2 = y(i);
        const d = y1 === y2 ? `M${x1},${y1} L${x2},${y2}` : `M${x1},${y1} C${x1 + COL * 0.6},${y1} ${x2 - COL * 0.6},${y2} ${x2},${y2}`;
        edges.appendChild(el("path", { d: d, stroke: lane[i] ? "#6e7681" : "#30363d", "stroke-width": lane[i] ? 2 : 3,
          fill: "none", "stroke-dasharray": lane[i] ? "5 4" : "" }));
      }
      if (lane[i] === 0) lastMain = i; else lastBranch = i;
      if (s.type === "rollback" && s.to !== undefined && s.to < shown.length) {
        const x1 = x(i), y1 = y(i), x2 = x(s.to), y2 = y(s.to) + 15;
        edges.appendChild(el("path", { d: `M${x1},${y1 - 13} C${x1},${y2 + 10} ${x2 + 20},${y2 + 30} ${x2 + 2},${y2}`,
          stroke: "#db6d28", "stroke-width": 2, fill: "none", "marker-end": "url(#arr)" }));
        lastBranch = -1;
      }
    });
    shown.forEach((s, i) => {
      const g = el("g", { class: "node", transform: `translate(${x(i)},${y(i)})`, opacity: lane[i] && s.type !== "rollback" ? 0.55 : 1 });
      g.appendChild(el("title", {}, title(s)));
      const c = colorOf(s);
      if (s.type === "savepoint") {
        g.appendChild(el("rect", { x: -10, y: -10, width: 20, height: 20, transform: "rotate(45)", fill: "#0d1117", stroke: c, "stroke-width": 3 }));
      } else if (s.type === "begin" || s.type === "end") {
        g.appendChild(el("circle", { r: 12, fill: "#0d1117", stroke: c, "stroke-width": 3 }));
        g.appendChild(el("circle", { r: 6, fill: c }));
      } else if (s.type === "read" || s.type === "result") {
        g.appendChild(el("circle", { r: 7, fill: "#0d1117", stroke: c, "stroke-width": 2.5 }));
      } else {
        g.appendChild(el("circle", { r: 10, fill: c, stroke: "#0d1117", "stroke-width": 2 }));
      }
      const ty = lane[i] ? 30 : -34, dy = lane[i] ? 45 : -20;  // main line: above; branch: below
      g.appendChild(el("text", { y: ty, "text-anchor": "middle", fill: "#e6edf3", "font-size": 11.5, "font-weight": 600 }, s.type));
      g.appendChild(el("text", { y: dy, "text-anchor": "middle", fill: "#8b949e", "font-size": 11 }, short(detail(s), 14)));
      nodes.appendChild(g);
    });
    if (steps.length > shown.length) {
      svg.appendChild(el("text", { x: width - 10, y: 16, "text-anchor": "end", fill: "#8b949e", "font-size": 12 },
        "first " + shown.length + " of " + steps.length + " steps"));
    }
    return svg;
  }

  window.A2Graph = { draw: draw };
})();
