"""The budget picture: an MCP App (``text/html;profile=mcp-app``) for estimate_memory and suggest_cheaper_config.

Hosts that support MCP Apps render :data:`BUDGET_APP_URI` in a sandboxed iframe next to the tool's
result. The page speaks the Apps postMessage protocol (``ui/initialize``, then
``ui/notifications/tool-result``) and draws, from the result's structured content alone:

- estimate_memory: the verdict and the one number that decides (how much over, how much free, or for a
  tight plan how little is free or how far into the margin it goes), under it the row "full / LoRA / QLoRA on
  this GPU" (each with its verdict badge, the plan's own method outlined), what the estimate chose for the
  hardware (``chosen_defaults``), a stacked bar of the budget (one fixed colour per component, by name,
  from server/palette.py; the safety margin hatched) on an axis with true ticks and the GPU's usable
  memory as a labelled line, and the breakdown as a table;
- suggest_cheaper_config: the plan's verdict and number, its bar, then one card per suggestion (a grid
  that stacks on narrow hosts), the recommended one marked, each change as the flag and the field the
  user would type (``--seq-len 1408``, ``seq_len: 2048 → 1408``), no raw scores.

Theme: the page follows the host. It reads ``hostContext.theme`` and ``hostContext.styles.variables``
(the spec's ``--color-background-primary``, ``--color-text-primary``, ``--font-sans``...) from the
``ui/initialize`` result and from ``ui/notifications/host-context-changed`` (partial updates, merged),
sets ``color-scheme`` so a host's ``light-dark()`` values resolve, and falls back to its own light and
dark themes (server/palette.py THEMES, every text pair at least 4.5:1) where the host passes nothing.

The page is self-contained (inline CSS and JS, no fonts, images or network), and the text and
structured results stay complete for hosts without Apps. :func:`preview_html` inlines a result so the
same page renders in a plain browser (the tests render it in headless Chromium).
"""

from __future__ import annotations

import json
from typing import Any

from .palette import THEMES, palette_json

BUDGET_APP_URI = "ui://canifinetune/budget.html"

_HTML = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>canifinetune: GPU memory budget</title>
<style>
/*THEME*/
  :root { color-scheme: light dark;
    --bg: var(--color-background-primary, var(--cf-bg)); --panel: var(--color-background-secondary, var(--cf-panel));
    --fg: var(--color-text-primary, var(--cf-fg)); --muted: var(--color-text-secondary, var(--cf-muted));
    --line: var(--color-border-primary, var(--cf-line)); --danger: var(--color-text-danger, var(--cf-danger));
    --success: var(--color-text-success, var(--cf-success)); --warning: var(--color-text-warning, var(--cf-warning));
    --accent: var(--color-text-info, var(--cf-accent));
    --font: var(--font-sans, system-ui, -apple-system, "Segoe UI", Roboto, sans-serif);
    --mono: var(--font-mono, ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace);
    --radius: var(--border-radius-md, 6px); }
  * { box-sizing: border-box; }
  body { margin: 0; padding: 14px 16px; font: 13px/1.45 var(--font); color: var(--fg); background: var(--bg); }
  .lead { display: flex; flex-wrap: wrap; align-items: baseline; gap: 4px 10px; }
  .verdict { display: inline-block; padding: 2px 8px; border-radius: 4px; font-weight: 700; letter-spacing: .02em;
             white-space: nowrap; }
  .number { font-size: 22px; font-weight: 700; font-variant-numeric: tabular-nums; }
  .t-danger { color: var(--danger); } .t-success { color: var(--success); } .t-warning { color: var(--warning); }
  .reason { margin: 2px 0 8px; }
  .methods { display: flex; flex-wrap: wrap; gap: 4px 8px; margin: 6px 0 2px; font-size: 12px; }
  .method { display: inline-flex; align-items: center; gap: 5px; padding: 2px 7px; border: 1px solid var(--line);
            border-radius: 4px; white-space: nowrap; font-variant-numeric: tabular-nums; }
  .method.current { border: 2px solid var(--fg); padding: 1px 6px; }
  .method .verdict { font-size: 10.5px; padding: 0 5px; }
  .method b { font-weight: 600; }
  .chosen { font-size: 12px; margin: 2px 0; }
  h1 { font-size: 14px; margin: 6px 0 0; font-weight: 600; overflow-wrap: anywhere; }
  .muted { color: var(--muted); }
  .chart { position: relative; margin: 24px 0 2px; }
  .chart.compact { margin-top: 20px; }
  .track { position: relative; height: 30px; border: 1px solid var(--line); border-radius: 3px; overflow: hidden; }
  .compact .track { height: 18px; }
  .free { position: absolute; top: 3px; bottom: 3px; border: 1px dashed var(--success); border-left: 0;
          color: var(--success); font-size: 11px; font-weight: 600; display: flex; align-items: center;
          justify-content: center; overflow: hidden; white-space: nowrap; }
  .segs { position: absolute; top: 0; bottom: 0; left: 0; display: flex; }
  .seg { height: 100%; min-width: 1px; box-shadow: inset -1px 0 0 var(--bg); }
  .seg.margin, i.margin { background: repeating-linear-gradient(45deg, var(--cf-margin) 0 2px, transparent 2px 5px); }
  .gpu { position: absolute; top: -5px; bottom: -5px; width: 0; border-left: 3px solid var(--fg); z-index: 2;
         box-shadow: 0 0 0 1px var(--bg); }
  .gpu span { position: absolute; top: -17px; left: 3px; white-space: nowrap; font-size: 11px; font-weight: 700; }
  .gpu.right span { left: auto; right: 6px; }
  .axis { position: relative; height: 16px; font-size: 11px; color: var(--muted); font-variant-numeric: tabular-nums; }
  .axis span { position: absolute; top: 1px; transform: translateX(-50%); white-space: nowrap; }
  .axis span.first { transform: none; } .axis span.last { transform: translateX(-100%); }
  .axis span::before { content: ""; position: absolute; left: 50%; top: -3px; height: 3px; border-left: 1px solid var(--line); }
  .legend { display: flex; flex-wrap: wrap; gap: 3px 12px; margin: 8px 0; font-size: 12px; }
  .legend span { white-space: nowrap; }
  i.sw { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; vertical-align: -1px; }
  i.sw.gpuline { width: 0; border-left: 3px solid var(--fg); border-radius: 0; }
  table { border-collapse: collapse; width: 100%; margin-top: 6px; font-size: 12px; }
  td, th { text-align: left; padding: 3px 6px; border-bottom: 1px solid var(--line); vertical-align: top; }
  td.why { overflow-wrap: anywhere; }
  td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
  td.name { white-space: nowrap; }
  @media (max-width: 520px) {  /* narrow hosts: the explanation goes under its row */
    tr { display: grid; grid-template-columns: 1fr auto auto; border-bottom: 1px solid var(--line); }
    td, th { border-bottom: 0; } td.why { grid-column: 1 / -1; padding-top: 0; padding-left: 20px; } th.why { display: none; } }
  .cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 250px), 1fr)); gap: 10px;
           margin-top: 12px; }
  .card { min-width: 0; border: 1px solid var(--line); border-radius: var(--radius); padding: 8px 10px; }
  .card.recommended { border: 2px solid var(--accent); }
  .card h2 { font-size: 12.5px; margin: 0 0 4px; display: flex; flex-wrap: wrap; gap: 4px 8px; align-items: center; }
  .tag { font-size: 10.5px; font-weight: 700; letter-spacing: .04em; color: var(--accent); border: 1px solid var(--accent);
         border-radius: 3px; padding: 0 5px; }
  .card .verdict { font-size: 11px; padding: 1px 6px; }
  code { font-family: var(--mono); font-size: 11.5px; background: var(--panel); color: var(--fg); padding: 1px 4px;
         border-radius: 3px; overflow-wrap: anywhere; }
  .flags { margin: 6px 0 2px; display: flex; flex-wrap: wrap; gap: 4px; }
  .flags code { white-space: nowrap; }
  .changes { font-size: 11.5px; margin: 2px 0 0; padding-left: 16px; }
  .note { font-size: 11.5px; color: var(--muted); margin-top: 4px; }
  .note ul { margin: 2px 0 0; padding-left: 16px; }
  .facts { margin-top: 10px; }
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
  var PALETTE = /*PALETTE*/null;
  var VERDICT = { fits: "FITS", tight: "TIGHT", does_not_fit: "DOES NOT FIT", unknown: "NO VERDICT" };
  var TIERS = { same_math: "same maths", changes_learning: "changes what is learned", more_hardware: "more hardware" };
  var root = document.getElementById("app");
  var current = null, context = {}, lastSize = "";

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    for (var k in (attrs || {})) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "style") node.setAttribute("style", attrs[k]);
      else node.setAttribute(k, attrs[k]);
    }
    (children || []).forEach(function (c) {
      if (c === null || c === undefined || c === false) return;
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return node;
  }
  function num(n, digits) { return (n / GIB).toFixed(digits === undefined ? 2 : digits); }
  function gib(n) { return num(n) + " GiB"; }
  function pct(x) { return Math.round(x * 100) + "%"; }
  function colorOf(name) { return PALETTE.components[name] || PALETTE.other; }
  function swatch(name) {
    return name === "safety_margin" ? el("i", { "class": "sw margin" }) : el("i", { "class": "sw", style: "background:" + colorOf(name) });
  }
  function badge(verdict) {
    var v = PALETTE.verdicts[verdict] || PALETTE.verdicts.unknown;
    return el("span", { "class": "verdict v-" + verdict, style: "color:" + v.fg + ";background:" + v.bg, text: VERDICT[verdict] || verdict });
  }
  // Words only: no raw scores, long floats rounded.
  function tidy(s) {
    return String(s || "").replace(/\s*quality penalty [-0-9.e]+,?\s*/g, " ").replace(/\(\s+/g, "(").replace(/\s*\(\s*\)/g, "")
      .replace(/\d+\.\d{3,}/g, function (m) { return String(Math.round(parseFloat(m) * 100) / 100); }).replace(/\s{2,}/g, " ").trim();
  }

  // The one number that decides: how much over, or how much free.
  function lead(est) {
    var usable = est.gpu_usable_bytes || 0, budget = est.budget_bytes || 0;
    var margin = (est.breakdown || []).filter(function (c) { return c.name === "safety_margin"; })[0];
    var total = est.total_bytes || (budget - (margin ? margin.bytes : 0));
    var per = est.per_gpu ? " per GPU" : "";
    if (!usable || est.verdict === "unknown") return { text: "needs " + gib(budget) + per, cls: "" };
    if (est.verdict === "does_not_fit" && total <= usable)  // the GPU holds it; the host RAM (host_ram_gb) does not
      return { text: "needs " + gib(est.host_memory_bytes || 0) + " of host RAM", cls: "t-danger" };
    if (est.verdict === "does_not_fit") return { text: gib(total - usable) + " over" + per, cls: "t-danger" };
    if (est.verdict === "tight" && budget > usable) return { text: gib(budget - usable) + " into the margin" + per, cls: "t-warning" };
    if (est.verdict === "tight") return { text: "only " + gib(usable - budget) + " free" + per, cls: "t-warning" };
    return { text: gib(usable - budget) + " free" + per, cls: "t-success" };
  }
  // full / LoRA / QLoRA on this GPU, in one row under the verdict; the plan's own method outlined.
  var METHOD_LABELS = { full: "full", lora: "LoRA", qlora: "QLoRA" };
  function methodRow(est) {
    var tiers = est.tiers || [];
    if (!tiers.length) return null;
    var mine = est.method || (est.plan || {}).method;
    var eight = (est.plan || {}).load_in_8bit;
    return el("div", { "class": "methods", role: "list", "aria-label": "full, LoRA and QLoRA on this GPU" }, tiers.map(function (t) {
      var label = (METHOD_LABELS[t.method] || t.method) + (t.method === "lora" && eight && mine === "lora" ? " (8-bit)" : "");
      var figure = !t.verdict ? "n/a" : t.verdict === "does_not_fit" || t.verdict === "unknown" || typeof t.used_fraction !== "number"
        ? num(t.budget_bytes || 0, 1) + " GiB" : pct(t.used_fraction);
      return el("span", { "class": "method" + (t.method === mine ? " current" : ""), role: "listitem", "data-tier": t.method,
        title: t.refused || (t.method === mine ? "your plan" : "") },
        [el("b", { text: label }), t.verdict ? badge(t.verdict) : null, figure]);
    }));
  }
  function chosenNodes(est) {
    return (est.chosen_defaults || []).map(function (c) { return el("div", { "class": "chosen muted", text: "chose: " + c }); });
  }
  function leadNodes(est, title) {
    var l = lead(est);
    return [el("div", { "class": "lead" }, [badge(est.verdict), el("span", { "class": "number " + l.cls, text: l.text })]),
      methodRow(est),
      title ? el("h1", { text: title }) : null,
      el("div", { "class": "reason muted", text: est.verdict_reason || "" })].concat(chosenNodes(est)).concat(
      est.speed ? [el("div", { "class": "chosen muted", text: est.speed })] : []);
  }

  // Axis ticks at round values: the scale ends on the last tick, so every label sits at its value.
  function ticks(maxBytes) {
    var maxG = Math.max(maxBytes / GIB, 0.001) * 1.02;
    var steps = [0.125, 0.25, 0.5, 1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64, 80, 100, 128, 160, 200, 256, 400, 512, 1000];
    var step = steps.filter(function (s) { return maxG / s <= 6; })[0] || Math.pow(2, Math.ceil(Math.log2(maxG / 6)));
    var n = Math.ceil(maxG / step), out = [];
    for (var i = 0; i <= n; i++) out.push(i * step);
    return { values: out, scale: n * step * GIB };
  }
  function tickLabel(g, last) {
    var s = g >= 1 || g === 0 ? String(Math.round(g * 100) / 100) : g.toFixed(3).replace(/0+$/, "");
    return last ? s + " GiB" : s;
  }

  // One stacked bar on the shared scale: components by name, the safety margin hatched, the GPU line labelled.
  function chart(components, budget, usable, t, compact, fallbackColor) {
    var scale = t.scale;
    var track = el("div", { "class": "track", role: "img",
      "aria-label": "budget " + gib(budget) + (usable ? " against " + gib(usable) + " usable on the GPU" : "") });
    if (usable && budget < usable) {
      var w = 100 * (usable - budget) / scale;
      track.appendChild(el("div", { "class": "free", title: "free: " + gib(usable - budget),
        style: "left:" + (100 * budget / scale) + "%;width:" + w + "%", text: !compact && w > 14 ? "free " + gib(usable - budget) : "" }));
    }
    var segs = el("div", { "class": "segs", style: "width:" + (100 * budget / scale) + "%" });
    var used = 0;
    components.forEach(function (c) {
      if (!(c.bytes > 0)) return;
      used += c.bytes;
      segs.appendChild(el("div", { "class": c.name === "safety_margin" ? "seg margin" : "seg", "data-component": c.name,
        title: c.name + ": " + gib(c.bytes),
        style: "width:" + (100 * c.bytes / budget) + "%" + (c.name === "safety_margin" ? "" : ";background:" + colorOf(c.name)) }));
    });
    if (!components.length && budget > 0) {
      segs.appendChild(el("div", { "class": "seg", "data-component": "budget", style: "width:100%;background:" + (fallbackColor || "var(--muted)") }));
    } else if (used < budget) {
      segs.appendChild(el("div", { "class": "seg margin", "data-component": "rest", style: "width:" + (100 * (budget - used) / budget) + "%" }));
    }
    track.appendChild(segs);
    var wrap = el("div", { "class": "chart" + (compact ? " compact" : "") }, [track]);
    if (usable) {
      wrap.appendChild(el("div", { "class": "gpu" + (usable / scale > 0.55 ? " right" : ""), "data-gpu-line": num(usable),
        style: "left:calc(" + (100 * usable / scale) + "% - 1px)" },
        [el("span", { text: (compact ? "GPU " : "GPU usable ") + gib(usable) })]));
    }
    var axis = el("div", { "class": "axis" }, t.values.map(function (g, i) {
      var last = i === t.values.length - 1;
      return el("span", { "class": i === 0 ? "first" : last ? "last" : "", "data-tick": String(g),
        style: "left:" + (100 * g * GIB / scale) + "%", text: tickLabel(g, last) });
    }));
    return el("div", {}, [wrap, compact && t.values.length > 1 ? null : axis]);
  }

  function planLine(est) {
    var plan = est.plan || {};
    var parts = [est.method || plan.method, plan.seq_len ? "seq_len " + plan.seq_len + (plan.batch_size ? " x batch " + plan.batch_size : "") : null,
      plan.dtype, plan.optim, est.peak_phase ? "peak in " + est.peak_phase : null];
    return parts.filter(function (p) { return p; }).join(", ");
  }

  function renderEstimate(est) {
    var usable = est.gpu_usable_bytes || 0;
    var comps = (est.breakdown || []).filter(function (c) { return c.bytes > 0; });
    var t = ticks(Math.max(est.budget_bytes || 0, usable));
    var gpu = est.gpu ? est.gpu.name : "no GPU given";
    var legend = el("div", { "class": "legend" }, comps.map(function (c) {
      return el("span", {}, [swatch(c.name), c.name + " " + num(c.bytes)]);
    }).concat(usable ? [el("span", {}, [el("i", { "class": "sw gpuline" }), "GPU usable " + gib(usable)])] : []));
    var rows = comps.map(function (c) {
      return el("tr", { "data-row": c.name }, [el("td", { "class": "name" }, [swatch(c.name), c.name]),
        el("td", { "class": "num", text: num(c.bytes) }),
        el("td", { "class": "num", text: est.budget_bytes ? pct(c.bytes / est.budget_bytes) : "" }),
        el("td", { "class": "why muted", text: c.explanation || "" })]);
    });
    var table = el("table", {}, [el("thead", {}, [el("tr", {}, [el("th", { text: "component" }), el("th", { "class": "num", text: "GiB" }),
      el("th", { "class": "num", text: "share" }), el("th", { "class": "why", text: "why" })])]), el("tbody", {}, rows)]);
    var warn = (est.warnings || []).map(function (w) { return el("div", { "class": "note", text: "warning: " + w }); });
    return leadNodes(est, est.model + " on " + gpu + (est.per_gpu ? " (per GPU)" : ""))
      .concat([el("div", { "class": "muted", text: planLine(est) }), chart(comps, est.budget_bytes || 0, usable, t, false), legend, table])
      .concat(warn);
  }

  // A change as the user would type it: the CLI flag and the field.
  function value(v) { return Array.isArray(v) ? v.join(",") : v === null || v === undefined ? "default" : String(v); }
  function flag(c) {
    var name = "--" + c.field.replace(/_/g, "-");
    if (c["new"] === true) return name;
    if (c["new"] === false) return "--no-" + c.field.replace(/_/g, "-");
    if (c["new"] === null || c["new"] === undefined) return null;
    var v = value(c["new"]);
    return name + " " + (/[\s"'$]/.test(v) ? '"' + v.replace(/"/g, '\\"') + '"' : v);
  }
  function field(c) { return c.field + ": " + value(c.old) + " → " + value(c["new"]); }
  function speed(cost) {
    var x = cost.slowdown_fraction;
    if (typeof x !== "number") return null;
    if (Math.abs(x) < 0.05) return "about the same speed";
    if (x >= 1) return "about " + (1 + x).toFixed(1) + "x the time per token";
    return "about " + Math.round(Math.abs(x) * 100) + "% " + (x > 0 ? "slower" : "faster");
  }

  function renderSuggestions(res) {
    var orig = res.original || {};
    var sugs = res.suggestions || [];
    var usable = orig.gpu_usable_bytes || 0;
    var gpu = orig.gpu ? orig.gpu.name : "GPU";
    var all = [orig.budget_bytes || 0].concat(sugs.map(function (s) { return (s.estimate || {}).budget_bytes || 0; }));
    var t = ticks(Math.max.apply(null, all.concat([usable])));
    var answer = res.fits_already ? "it fits on the " + gpu + " as it is: nothing to change"
      : sugs.length ? sugs.length + (sugs.length === 1 ? " configuration fits" : " configurations fit") + "; recommended: " +
        (sugs[0].changes || []).map(field).join(", ")
      : "nothing fits on the " + gpu + " with the allowed changes";
    var out = leadNodes(orig, "Suggestions: " + (orig.model || "") + " on " + gpu);
    out.push(el("div", { "class": "answer", text: answer }));
    if ((res.keep || []).length) out.push(el("div", { "class": "muted", text: "pinned: " + res.keep.join(", ") }));
    out.push(el("div", { "class": "muted", style: "margin-top:8px", text: "your plan" }));
    out.push(chart((orig.breakdown || []).filter(function (c) { return c.bytes > 0; }), orig.budget_bytes || 0, usable, t, false));
    var cards = sugs.map(function (s, i) {
      var est = s.estimate || {}, cost = s.cost || {}, rec = i === 0;
      var l = lead(est);
      var flags = (s.changes || []).map(flag).filter(function (f) { return f; });
      var hasDetails = !!(cost.details && cost.details.length);  // else the summary says the speed itself
      var notes = [hasDetails ? speed(cost) : null, cost.extra_gpus ? "+" + cost.extra_gpus + " GPU" + (cost.extra_gpus > 1 ? "s" : "") : null,
        est.host_memory_bytes ? "needs " + gib(est.host_memory_bytes) + " of host RAM" : null].filter(function (n) { return n; });
      var details = (hasDetails ? cost.details : [cost.summary]).map(tidy).filter(function (d) { return d; });
      return el("div", { "class": "card" + (rec ? " recommended" : ""), "data-rank": String(s.rank || i + 1) }, [
        el("h2", {}, [rec ? el("span", { "class": "tag", text: "RECOMMENDED" }) : null,
          el("span", { text: (s.rank || i + 1) + ". " + (TIERS[cost.tier] || String(cost.tier || "").replace(/_/g, " ")) })]),
        el("div", {}, [badge(est.verdict), " " + gib(est.budget_bytes || 0) + (l.cls ? ", " + l.text : "")]),
        chart((est.breakdown || []).filter(function (c) { return c.bytes > 0; }), est.budget_bytes || 0, usable, t, true),
        flags.length ? el("div", { "class": "flags", title: "as canifinetune flags" }, flags.map(function (f) { return el("code", { text: f }); })) : null,
        el("ul", { "class": "changes" }, (s.changes || []).map(function (c) { return el("li", {}, [el("code", { text: field(c) })]); })),
        el("div", { "class": "note" }, [notes.join("; "), details.length ? el("ul", {}, details.map(function (d) { return el("li", { text: d }); })) : null])
      ]);
    });
    if (cards.length) out.push(el("div", { "class": "cards" }, cards));
    var facts = [];
    if (res.nothing_fits && res.min_reachable_bytes) facts.push("least memory reachable on the " + gpu + ": " + gib(res.min_reachable_bytes));
    if (res.smallest_gpu) facts.push("smallest catalog GPU for the plan unchanged: " + res.smallest_gpu +
      (res.smallest_gpu_usable_bytes ? " (" + gib(res.smallest_gpu_usable_bytes) + " usable)" : ""));
    if (res.min_gpus) facts.push("fewest GPUs for the plan unchanged: " + res.min_gpus + " x " + gpu + " with sharding " + res.min_gpus_sharding);
    if (facts.length) out.push(el("div", { "class": "facts" }, facts.map(function (f) { return el("div", { text: f }); })));
    return out;
  }

  function sendSize() {
    var size = { width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight };
    var key = size.width + "x" + size.height;
    if (key === lastSize) return;
    lastSize = key;
    notify("ui/notifications/size-changed", size);
  }

  function render(data) {
    if (!data || typeof data !== "object") return;
    var nodes = "breakdown" in data ? renderEstimate(data) : ("suggestions" in data ? renderSuggestions(data) : null);
    if (!nodes) return;
    current = data;
    root.textContent = "";
    nodes.forEach(function (n) { if (n) root.appendChild(n); });
    document.body.setAttribute("data-rendered", "breakdown" in data ? "estimate" : "suggestions");
    document.body.setAttribute("data-overflow-x", String(document.documentElement.scrollWidth > document.documentElement.clientWidth));
    sendSize();
  }

  // ---- the host's theme: hostContext.theme and styles.variables (ui/initialize, host-context-changed)
  function applyContext(ctx) {
    if (!ctx || typeof ctx !== "object") return;
    var docEl = document.documentElement;
    if (ctx.theme === "light" || ctx.theme === "dark") {
      docEl.setAttribute("data-theme", ctx.theme);
      docEl.style.colorScheme = ctx.theme;
    }
    var styles = ctx.styles || {};
    var vars = styles.variables || {};
    Object.keys(vars).forEach(function (k) {
      if (k.indexOf("--") !== 0) return;
      if (vars[k] === null || vars[k] === undefined || vars[k] === "") docEl.style.removeProperty(k);
      else docEl.style.setProperty(k, String(vars[k]));
    });
    if (styles.css && typeof styles.css.fonts === "string") {
      var tag = document.getElementById("host-fonts") || document.head.appendChild(el("style", { id: "host-fonts" }));
      tag.textContent = styles.css.fonts;
    }
    for (var k in ctx) context[k] = ctx[k];
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
    } else if (msg.method === "ui/notifications/host-context-changed") {
      applyContext(msg.params);
      if (current) render(current);
    } else if (msg.id !== undefined && msg.method) {  // a request we do not serve (e.g. ui/resource-teardown)
      post({ jsonrpc: "2.0", id: msg.id, result: {} });
    }
  });
  if (window.ResizeObserver) new ResizeObserver(function () { if (current) sendSize(); }).observe(document.documentElement);

  var preview = JSON.parse(document.getElementById("preview-data").textContent);
  if (preview) {
    render(preview);
  } else if (window.parent && window.parent !== window) {
    request("ui/initialize", { protocolVersion: "2026-01-26", appInfo: { name: "canifinetune-budget", version: "2" },
      appCapabilities: { availableDisplayModes: ["inline"] } }).then(function (result) {
        applyContext((result || {}).hostContext);
        notify("ui/notifications/initialized", {});
      }, function () { notify("ui/notifications/initialized", {}); });
  }
})();
</script>
</body>
</html>
"""


def _theme_css() -> str:
    """The App's own light and dark themes as CSS variables (--cf-*), used where the host passes none.

    Light by default; dark when the host says ``theme: "dark"`` (``data-theme`` on the root) or, without a
    host theme, when the browser prefers dark."""
    def block(theme: str) -> str:
        return " ".join(f"--cf-{k}: {v};" for k, v in THEMES[theme].items())
    margin = palette_json()["margin"]
    return (f"  :root {{ {block('light')} --cf-margin: {margin}; }}\n"
            f"  :root[data-theme=\"dark\"] {{ {block('dark')} }}\n"
            f"  @media (prefers-color-scheme: dark) {{ :root:not([data-theme=\"light\"]) {{ {block('dark')} }} }}\n")


_PAGE = _HTML.replace("/*THEME*/\n", _theme_css()).replace("/*PALETTE*/null", json.dumps(palette_json()))


def budget_app_html() -> str:
    """The app's HTML as served to hosts: waits for the host's tool result."""
    return _PAGE


def preview_html(structured: dict[str, Any], theme: str | None = None) -> str:
    """The same page with a tool's structured result inlined, for a plain browser (no host needed).

    ``theme`` ("light" or "dark") fixes the theme as a host's ``hostContext.theme`` would; without it the
    page follows the browser's ``prefers-color-scheme``."""
    data = json.dumps(structured).replace("</", "<\\/")
    page = _PAGE.replace(
        '<script id="preview-data" type="application/json">null</script>',
        f'<script id="preview-data" type="application/json">{data}</script>',
    )
    if theme is not None:
        if theme not in THEMES:
            raise ValueError(f"theme: {theme!r} is not one of {sorted(THEMES)}")
        page = page.replace('<html lang="en">', f'<html lang="en" data-theme="{theme}" style="color-scheme: {theme}">', 1)
    return page
