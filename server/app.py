"""The budget picture: an MCP App (``text/html;profile=mcp-app``) for estimate_memory and suggest_cheaper_config.

Hosts that support MCP Apps render :data:`BUDGET_APP_URI` in a sandboxed iframe next to the tool's
result. The page speaks the Apps postMessage protocol (``ui/initialize``, then
``ui/notifications/tool-result``) and draws, from the result's structured content alone:

- estimate_memory: the verdict, a stacked bar of the budget (one segment per component, in order,
  plus the safety margin) against a line at the GPU's usable memory, and the breakdown as a table;
- suggest_cheaper_config: the original plan's bar and every suggestion's bar side by side, on one scale.

The page is self-contained (inline CSS and JS, no fonts, images or network), and the text and
structured results stay complete for hosts without Apps. :func:`preview_html` inlines a result so the
same page renders in a plain browser (the test renders it in headless Chromium).
"""

from __future__ import annotations

import json
from typing import Any

BUDGET_APP_URI = "ui://canifinetune/budget.html"

_HTML = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>canifinetune: GPU memory budget</title>
<style>
  :root { color-scheme: light dark; --fg: #1d2433; --muted: #5b6475; --bg: #ffffff; --line: #d5d9e0;
          --fits: #1f8a4c; --tight: #b7791f; --nofit: #c53030; --unknown: #5b6475; }
  @media (prefers-color-scheme: dark) {
    :root { --fg: #e6e9ef; --muted: #a3abba; --bg: #161a22; --line: #394150; }
  }
  * { box-sizing: border-box; }
  body { margin: 0; padding: 14px 16px; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
         color: var(--fg); background: var(--bg); }
  h1 { font-size: 15px; margin: 0 0 4px; }
  .verdict { display: inline-block; padding: 2px 8px; border-radius: 4px; color: #fff; font-weight: 700;
             margin-right: 6px; }
  .v-fits { background: var(--fits); } .v-tight { background: var(--tight); }
  .v-does_not_fit { background: var(--nofit); } .v-unknown { background: var(--unknown); }
  .muted { color: var(--muted); }
  .bar-wrap { position: relative; margin: 22px 0 4px; }
  .bar { display: flex; height: 30px; border: 1px solid var(--line); border-radius: 4px; overflow: hidden;
         background: repeating-linear-gradient(45deg, transparent 0 6px, rgba(127,127,127,.08) 6px 12px); }
  .seg { height: 100%; min-width: 1px; }
  .seg.margin { background: repeating-linear-gradient(45deg, #9aa3b2 0 4px, #c4cad4 4px 8px) !important; }
  .cap { position: absolute; top: -6px; bottom: -6px; width: 0; border-left: 3px solid var(--nofit); }
  .cap.left span { left: auto; right: 6px; }
  .cap span { position: absolute; top: -16px; left: 4px; white-space: nowrap; font-size: 11px; font-weight: 600;
              color: var(--nofit); }
  .axis { display: flex; justify-content: space-between; font-size: 11px; color: var(--muted); }
  .legend { display: flex; flex-wrap: wrap; gap: 4px 12px; margin: 8px 0; font-size: 12px; }
  .legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px;
              vertical-align: -1px; }
  table { border-collapse: collapse; width: 100%; margin-top: 6px; font-size: 12px; }
  td, th { text-align: left; padding: 3px 6px; border-bottom: 1px solid var(--line); vertical-align: top; }
  td:first-child { white-space: nowrap; }
  td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
  .cards { display: flex; gap: 10px; overflow-x: auto; padding-bottom: 4px; margin-top: 10px; }
  .card { flex: 1 0 190px; max-width: 280px; border: 1px solid var(--line); border-radius: 6px; padding: 8px; }
  .card h2 { font-size: 12px; margin: 0 0 4px; }
  .card .bar { height: 20px; }
  .card .changes { font-size: 11.5px; margin: 4px 0 0; padding-left: 14px; }
  .card .note { font-size: 11px; color: var(--muted); margin-top: 4px; }
  #status { color: var(--muted); }
</style>
</head>
<body>
<div id="app"><p id="status">Waiting for a canifinetune result…</p></div>
<script id="preview-data" type="application/json">null</script>
<script>
(function () {
  "use strict";
  var GIB = 1073741824;
  var COLORS = ["#3b6fd8", "#e0833a", "#2f9e7a", "#b44fc4", "#d4b02c", "#d4495b", "#4fb0c6", "#7a8f2c",
                "#8c5a3c", "#5d4fc4", "#c47a9e", "#3c8c5a", "#9e7a3c", "#607d8b"];
  var VERDICT = { fits: "FITS", tight: "TIGHT", does_not_fit: "DOES NOT FIT", unknown: "NO VERDICT" };
  var root = document.getElementById("app");

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    for (var k in (attrs || {})) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "style") node.setAttribute("style", attrs[k]);
      else node.setAttribute(k, attrs[k]);
    }
    (children || []).forEach(function (c) { if (c) node.appendChild(c); });
    return node;
  }
  function gib(n) { return (n / GIB).toFixed(2) + " GiB"; }
  function pct(x) { return Math.round(x * 100) + "%"; }
  function colorOf(i) { return COLORS[i % COLORS.length]; }
  function fill(c, i) {
    return c.name === "safety_margin" ? "background:repeating-linear-gradient(45deg,#9aa3b2 0 3px,#c4cad4 3px 6px)"
                                      : "background:" + colorOf(i);
  }

  // One stacked bar: the components (in order), then the safety margin, on a shared scale.
  function stackedBar(components, budget, usable, scale, compact) {
    var bar = el("div", { "class": "bar", role: "img",
      "aria-label": "budget " + gib(budget) + (usable ? " of " + gib(usable) : "") });
    var used = 0;
    components.forEach(function (c, i) {
      if (c.bytes <= 0) return;
      used += c.bytes;
      bar.appendChild(el("div", { "class": c.name === "safety_margin" ? "seg margin" : "seg", "data-component": c.name,
        title: c.name + ": " + gib(c.bytes), style: "width:" + (100 * c.bytes / scale) + "%;background:" + colorOf(i) }));
    });
    var rest = components.length ? Math.max(0, budget - used) : 0;  // the breakdown sums to the budget
    if (rest > 0) bar.appendChild(el("div", { "class": "seg margin", "data-component": "rest",
      title: "rest: " + gib(rest), style: "width:" + (100 * rest / scale) + "%" }));
    var wrap = el("div", { "class": "bar-wrap" }, [bar]);
    if (usable) {
      wrap.appendChild(el("div", { "class": usable / scale > 0.7 ? "cap left" : "cap", style: "left:" + (100 * usable / scale) + "%" },
        [compact ? null : el("span", { text: "GPU usable " + gib(usable) })]));
    }
    return wrap;
  }

  function renderEstimate(est) {
    var usable = est.gpu_usable_bytes || 0;
    var scale = Math.max(est.budget_bytes, usable, 1) * 1.04;
    var gpu = est.gpu ? est.gpu.name : "no GPU given";
    var plan = est.plan || {};
    var comps = (est.breakdown || []).map(function (c) { return { name: c.name, bytes: c.bytes, explanation: c.explanation }; });
    var head = el("h1", {}, [el("span", { "class": "verdict v-" + est.verdict, text: VERDICT[est.verdict] || est.verdict }),
      el("span", { text: est.model + " on " + gpu + (est.per_gpu ? " (per GPU)" : "") })]);
    var sub = el("div", { "class": "muted", text: (plan.method || "") + ", seq_len " + plan.seq_len + " x batch " +
      plan.batch_size + ", " + plan.dtype + ", " + (plan.optim || "") + ", peak in " + (est.peak_phase || "?") });
    var reason = el("div", { "class": "muted", text: est.verdict_reason || "" });
    var legend = el("div", { "class": "legend" }, comps.filter(function (c) { return c.bytes > 0; }).map(function (c) {
      var i = comps.indexOf(c);
      return el("span", {}, [el("i", { style: fill(c, i) }), document.createTextNode(c.name + " " + gib(c.bytes))]);
    }).concat(usable ? [el("span", {}, [el("i", { style: "background:var(--nofit);width:3px" }),
      document.createTextNode("GPU usable memory " + gib(usable))])] : []));
    var axis = el("div", { "class": "axis" }, [el("span", { text: "0" }), el("span", { text: gib(scale / 1.04) })]);
    var rows = comps.map(function (c, i) {
      return el("tr", {}, [el("td", {}, [el("i", { style: "display:inline-block;width:9px;height:9px;margin-right:5px;" + fill(c, i) }),
        document.createTextNode(c.name)]), el("td", { "class": "num", text: gib(c.bytes) }), el("td", { "class": "muted", text: c.explanation || "" })]);
    });
    var table = el("table", {}, [el("thead", {}, [el("tr", {}, [el("th", { text: "component" }), el("th", { "class": "num", text: "memory" }),
      el("th", { text: "why" })])]), el("tbody", {}, rows)]);
    var warn = (est.warnings || []).map(function (w) { return el("div", { "class": "muted", text: "warning: " + w }); });
    return [head, sub, reason, stackedBar(comps, est.budget_bytes, usable, scale, false), axis, legend, table].concat(warn);
  }

  // suggest_cheaper_config's structured content is the search's SuggestResult (estimator/search.py).
  function changeText(c) { return c.field + ": " + JSON.stringify(c.old) + " → " + JSON.stringify(c.new); }

  function renderSuggestions(res) {
    var orig = res.original || {};
    var sugs = res.suggestions || [];
    var usable = orig.gpu_usable_bytes || 0;
    var gpu = orig.gpu ? orig.gpu.name : "GPU";
    var all = [orig.budget_bytes || 0].concat(sugs.map(function (s) { return s.estimate.budget_bytes; }));
    var scale = Math.max.apply(null, all.concat([usable, 1])) * 1.04;
    var head = res.fits_already ? "ALREADY FITS" : (sugs.length ? sugs.length + " THAT FIT" : "NOTHING FITS");
    var answer = res.fits_already ? "it fits on the " + gpu + " as it is: nothing to change"
      : sugs.length ? "apply the first: " + (sugs[0].changes || []).map(changeText).join(", ")
      : "nothing fits on the " + gpu + " with the allowed changes";
    var out = [el("h1", {}, [el("span", { "class": "verdict v-" + (res.fits_already || sugs.length ? "fits" : "does_not_fit"),
      text: head }), el("span", { text: "Suggestions: " + (orig.model || "") + " on " + gpu })]),
      el("div", { "class": "muted", text: answer })];
    if ((res.keep || []).length) out.push(el("div", { "class": "muted", text: "pinned: " + res.keep.join(", ") }));
    function card(title, budget, verdict, changes, note, cls) {
      var c = el("div", { "class": "card " + (cls || "") }, [el("h2", { text: title }),
        el("div", {}, [el("span", { "class": "verdict v-" + verdict, text: VERDICT[verdict] || verdict }),
          el("span", { text: gib(budget) + (usable ? " (" + pct(budget / usable) + ")" : "") })])]);
      var bar = stackedBar([], budget, usable, scale, true);
      bar.firstChild.appendChild(el("div", { "class": "seg", "data-component": title,
        style: "width:" + (100 * budget / scale) + "%;background:" + (verdict === "fits" ? "#2f9e7a" : verdict === "tight" ? "#d4b02c" : "#d4495b") }));
      c.appendChild(bar);
      if (changes) c.appendChild(el("ul", { "class": "changes" }, changes));
      if (note) c.appendChild(el("div", { "class": "note", text: note }));
      return c;
    }
    var cards = [card("your plan", orig.budget_bytes || 0, orig.verdict, null, null, "original")];
    sugs.forEach(function (s, i) {
      var est = s.estimate || {};
      var changes = (s.changes || []).map(function (c) { return el("li", { text: changeText(c) }); });
      var cost = s.cost || {};
      cards.push(card("suggestion " + (s.rank || i + 1) + (cost.tier ? " · " + cost.tier.replace(/_/g, " ") : ""),
        est.budget_bytes, est.verdict, changes, cost.summary));
    });
    out.push(el("div", { "class": "cards" }, cards));
    if (usable) out.push(el("div", { "class": "muted", text: "red line: GPU usable memory " + gib(usable) }));
    if (res.nothing_fits && res.min_reachable_bytes) out.push(el("div", { text: "least memory reachable on the " + gpu + ": " + gib(res.min_reachable_bytes) }));
    if (res.smallest_gpu) out.push(el("div", { text: "smallest catalog GPU for the plan unchanged: " + res.smallest_gpu +
      (res.smallest_gpu_usable_bytes ? " (" + gib(res.smallest_gpu_usable_bytes) + " usable)" : "") }));
    if (res.min_gpus) out.push(el("div", { text: "fewest GPUs for the plan unchanged: " + res.min_gpus + " x " + gpu + " with sharding '" + res.min_gpus_sharding + "'" }));
    return out;
  }

  function render(data) {
    if (!data || typeof data !== "object") return;
    var nodes = "breakdown" in data ? renderEstimate(data) : ("suggestions" in data ? renderSuggestions(data) : null);
    if (!nodes) return;
    root.textContent = "";
    nodes.forEach(function (n) { root.appendChild(n); });
    document.body.setAttribute("data-rendered", "breakdown" in data ? "estimate" : "suggestions");
    notify("ui/notifications/size-changed", { width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight });
  }

  // ---- the MCP Apps postMessage protocol (JSON-RPC 2.0 with the host window)
  var nextId = 1, pending = {};
  function post(msg) { if (window.parent && window.parent !== window) window.parent.postMessage(msg, "*"); }
  function notify(method, params) { post({ jsonrpc: "2.0", method: method, params: params || {} }); }
  function request(method, params) {
    var id = nextId++;
    return new Promise(function (resolve, reject) { pending[id] = { resolve: resolve, reject: reject };
      post({ jsonrpc: "2.0", id: id, method: method, params: params }); });
  }
  window.addEventListener("message", function (event) {
    var msg = event.data;
    if (!msg || msg.jsonrpc !== "2.0") return;
    if (msg.id !== undefined && pending[msg.id] && !msg.method) {
      var p = pending[msg.id]; delete pending[msg.id];
      if (msg.error) p.reject(msg.error); else p.resolve(msg.result);
      return;
    }
    if (msg.method === "ui/notifications/tool-result" && msg.params) {
      render(msg.params.structuredContent || msg.params.structured_content);
    } else if (msg.id !== undefined && msg.method) {  // a request we do not serve (e.g. ui/resource-teardown)
      post({ jsonrpc: "2.0", id: msg.id, result: {} });
    }
  });

  var preview = JSON.parse(document.getElementById("preview-data").textContent);
  if (preview) {
    render(preview);
  } else if (window.parent && window.parent !== window) {
    request("ui/initialize", { protocolVersion: "2026-01-26", appInfo: { name: "canifinetune-budget", version: "1" },
      appCapabilities: {} }).then(function () { notify("ui/notifications/initialized", {}); },
      function () { notify("ui/notifications/initialized", {}); });
  }
})();
</script>
</body>
</html>
"""


def budget_app_html() -> str:
    """The app's HTML as served to hosts: waits for the host's tool result."""
    return _HTML


def preview_html(structured: dict[str, Any]) -> str:
    """The same page with a tool's structured result inlined, for a plain browser (no host needed)."""
    data = json.dumps(structured).replace("</", "<\\/")
    return _HTML.replace(
        '<script id="preview-data" type="application/json">null</script>',
        f'<script id="preview-data" type="application/json">{data}</script>',
    )
