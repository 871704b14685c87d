#include "page.hpp"

namespace drun::rdzv::monitor {

const char* const kPageHtml = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>drun-rendezvous: jobs</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;background:#fafafa;color:#222}
h1{font-size:20px;margin:0 0 .3em} #status{color:#777;margin-bottom:1em}
.job{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.8em 1em;margin:0 0 1em}
.job h2{font-size:16px;margin:0 0 .3em}
.state{display:inline-block;padding:0 .5em;border-radius:3px;color:#fff;font-size:12px;margin-left:.5em}
.st-running{background:#2a7}.st-restarting{background:#d80}.st-failed{background:#c33}
.st-succeeded{background:#36c}.st-cancelled{background:#a6a}.st-forming,.st-ended{background:#888}
.timeline{display:flex;align-items:center;gap:4px;margin:.6em 0;flex-wrap:wrap}
.round{border:1px solid #999;border-radius:4px;padding:2px 8px;background:#eef6ee}
.round.failed{background:#fde2e2;border-color:#c33}.round.lost{background:#fff0d8;border-color:#d80}
.mark{font-weight:bold;cursor:help;padding:0 3px}.mark.failure{color:#c33}.mark.restart{color:#d80}
.mark.lost{color:#d80}.mark.taken{color:#36c}
.arrow{color:#aaa} table{border-collapse:collapse;margin:.3em 0} td,th{padding:1px 10px 1px 0;text-align:left}
.cause{color:#c33} .muted{color:#777} .when{font-size:11px;color:#777;margin-left:4px}
.exits span{margin-right:10px}.exits .bad{color:#c33}
</style></head>
<body><h1>drun-rendezvous: jobs</h1><div id="status">loading...</div><div id="jobs"></div>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token");
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
function cause(f) {
  if (!f) return "";
  let t = "rank " + f.rank + " on " + f.node + ": " + f.status;
  if (f.detail) t += "\n" + f.detail;
  return t;
}
function clock(ms) { return ms ? new Date(ms).toLocaleTimeString() : ""; }
function duration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  return (s >= 3600 ? Math.floor(s / 3600) + "h " : "") + (s >= 60 ? Math.floor(s / 60) % 60 + "m " : "") + s % 60 + "s";
}
function exitText(x) { return x.signal_name ? x.signal_name : "exit " + x.code; }
function address(n) {
  const m = /\(([^()]*)\)$/.exec(n.name || n.node);
  return m ? m[1] : "";
}
function timeline(job) {
  const line = el("div", {class: "timeline"});
  job.rounds.forEach((r, i) => {
    if (i) line.append(el("span", {class: "arrow"}, "\u2192"));
    const cls = "round" + (r.failure ? " failed" : "") + (r.lost.length ? " lost" : "");
    const span = clock(r.ts_ms) + "\u2013" + (r.ended_ts_ms ? clock(r.ended_ts_ms) : "");
    const box = el("span", {class: cls, "data-round": r.round, "data-start-ms": r.ts_ms || "",
                            "data-end-ms": r.ended_ts_ms || "",
                            title: "round " + r.round + " formed " + clock(r.ts_ms) +
                                   (r.ended_ts_ms ? ", ended " + clock(r.ended_ts_ms) : "") + ", world " +
                                   r.world_size + ", " + r.nodes.length + " node(s)"},
                   "round " + r.round, el("span", {class: "when"}, span));
    if (r.failure) box.append(el("span", {class: "mark failure", "data-root-cause": cause(r.failure),
                                          title: cause(r.failure)}, " \u2717"));
    for (const l of r.lost) box.append(el("span", {class: "mark lost", title: l}, " \u26a0"));
    for (const t of r.taken_in) box.append(el("span", {class: "mark taken", title: "taken in: " + t}, " +"));
    if (r.restart) box.append(el("span", {class: "mark restart", title: "restart"}, " \u21bb"));
    line.append(box);
  });
  return line;
}
function render(data) {
  const root = document.getElementById("jobs");
  root.replaceChildren();
  if (!data.jobs.length) root.append(el("p", {class: "muted"}, "no jobs"));
  for (const job of data.jobs) {
    const card = el("div", {class: "job", "data-run-id": job.run_id});
    card.append(el("h2", {}, job.run_id, el("span", {class: "state st-" + job.state}, job.state)));
    const budget = job.max_restarts === null ? "?" : job.max_restarts;
    card.append(el("div", {}, "round " + (job.round === null ? "-" : job.round) + " \u00b7 world size " +
                   job.world_size + " \u00b7 " + job.node_count + " node(s) \u00b7 restarts " +
                   job.restarts + " of " + budget));
    const started = job.rounds.length && job.rounds[0].ts_ms ? job.rounds[0].ts_ms : job.first_ts_ms;
    const ended = ["succeeded", "failed", "cancelled", "ended"].includes(job.state);
    if (started)
      card.append(el("div", {class: "times", "data-started-ms": started},
                     "started " + new Date(started).toLocaleString() + " \u00b7 " + (ended ? "ran " : "elapsed ") +
                     duration((ended && job.last_ts_ms ? job.last_ts_ms : Date.now()) - started)));
    card.append(timeline(job));
    for (const r of job.rounds.filter(r => r.exits && r.exits.length).slice(-3)) {
      const line = el("div", {class: "exits", "data-exits-round": r.round}, "round " + r.round + " exits: ");
      for (const x of r.exits)
        line.append(el("span", {class: x.code === 0 ? "" : "bad", "data-rank": x.rank, "data-exit": exitText(x)},
                       "rank " + x.rank + ": " + exitText(x)));
      card.append(line);
    }
    if (job.state === "cancelled" && job.cancelled && job.cancelled.length)
      card.append(el("div", {class: "cancelled"}, "cancelled: " + job.cancelled.map(c => c.by).join("; ")));
    if (job.last_root_cause)
      card.append(el("div", {class: "cause", title: cause(job.last_root_cause)},
                     "last root cause: " + cause(job.last_root_cause).split("\n")[0]));
    const nodes = el("table", {}, el("tr", {}, el("th", {}, "node rank"), el("th", {}, "node"),
                                     el("th", {}, "address"), el("th", {}, "ranks")));
    for (const n of job.nodes)
      nodes.append(el("tr", {}, el("td", {}, n.node_rank), el("td", {}, n.node.replace(/\(.*\)$/, "")),
                      el("td", {"data-address": address(n)}, address(n)),
                      el("td", {}, n.ranks.length === 2 ? n.ranks[0] + "\u2013" + n.ranks[1] : "")));
    card.append(nodes);
    card.append(el("div", {class: "muted"}, "waiting (spares, late joiners): " +
                   (job.waiting.length ? job.waiting.join(", ") : "none")));
    card.append(el("div", {class: job.hung.length ? "cause" : "muted"}, "hung ranks: " +
                   (job.hung.length ? job.hung.map(h => "rank " + h.rank + " on " + h.node +
                                                  (h.section ? " in " + h.section : "")).join(", ") : "none")));
    root.append(card);
  }
}
async function poll() {
  try {
    const r = await fetch("api/jobs" + (token ? "?token=" + encodeURIComponent(token) : ""), {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    document.getElementById("status").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("status").textContent = "cannot update: " + e.message;
  }
  setTimeout(poll, 1000);
}
poll();
</script></body></html>
)HTML";

}  // namespace drun::rdzv::monitor
