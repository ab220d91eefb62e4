// The coordinator's live view: polls /api/state (RunView::snapshot, schema in
// docs/OPERATIONS.md "Watching a run") every 2 s and draws it.
//
// Every string in the state comes from volunteers and is untrusted: this file builds the DOM with
// createElement + textContent (and setAttribute for data-/title attributes) only, never
// innerHTML or any other markup from data. Chart labels are drawn on canvases as text.
//
// For tests and scripts, each chart's canvas carries data-points: the number of points (or bars)
// Chart.js itself has laid out, and #status carries data-polls (answered polls) and data-ok.
"use strict";

const POLL_MS = 2000;
const MAX_EVENTS = 200;
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f",
                 "#be185d", "#1e3a8a", "#854d0e"];

// Node states mapped to one of five fixed classes; anything else is "other" (the text still shows).
const STATE_CLASS = {
  running: "ok", training: "ok", active: "ok", assigned: "ok", ready: "ok",
  joined: "wait", starting: "wait", waiting: "wait", paused: "wait", resuming: "wait",
  uploading: "wait", checkpointing: "wait",
  lost: "bad", failed: "bad", replaced: "bad", left: "bad", stopped: "bad", silent: "bad",
  done: "done", finished: "done", uploaded: "done",
  spare: "spare",
};
function stateClass(state) {
  const key = typeof state === "string" ? state.toLowerCase() : "";
  return "state-" + (Object.prototype.hasOwnProperty.call(STATE_CLASS, key) ? STATE_CLASS[key] : "other");
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function num(value, digits) {
  return typeof value === "number" && isFinite(value) ? value.toFixed(digits) : "–";
}

function duration(seconds) {
  if (typeof seconds !== "number" || !isFinite(seconds) || seconds < 0) return "–";
  const s = Math.round(seconds);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + String(s % 60).padStart(2, "0") + " s";
  return Math.floor(s / 3600) + " h " + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + " min";
}

function clockTime(unixSeconds) {
  if (typeof unixSeconds !== "number") return "–";
  return new Date(unixSeconds * 1000).toLocaleTimeString([], { hour12: false });
}

function color(index) { return PALETTE[((index % PALETTE.length) + PALETTE.length) % PALETTE.length]; }

function short(text) { return text.length > 24 ? text.slice(0, 23) + "…" : text; }

function array(value) { return Array.isArray(value) ? value : []; }

// ---- charts -------------------------------------------------------------------------------

const charts = {};

function lineChart(id, yTitle) {
  return new Chart(document.getElementById(id), {
    type: "line",
    data: { datasets: [] },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
      normalized: true, spanGaps: true,
      scales: { x: { type: "linear", title: { display: true, text: "step" } },
                y: { title: { display: true, text: yTitle } } },
      elements: { point: { radius: 2 }, line: { borderWidth: 2 } },
      plugins: { legend: { position: "bottom" } },
    },
  });
}

function makeCharts() {
  charts.loss = lineChart("chart-loss", "loss");
  charts.eval = lineChart("chart-eval", "value");
  charts.throughput = lineChart("chart-throughput", "samples/s");
  charts.split = new Chart(document.getElementById("chart-split"), {
    type: "bar",
    data: { labels: [], datasets: [
      { label: "compute", data: [], backgroundColor: "#2563eb" },
      { label: "send", data: [], backgroundColor: "#f59e0b" },
      { label: "wait", data: [], backgroundColor: "#9ca3af" },
    ] },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false,
      maxBarThickness: 64,
      scales: { x: { stacked: true }, y: { stacked: true, title: { display: true, text: "s" } } },
      plugins: { legend: { position: "bottom" } },
    },
  });
}

// [[step, value], ...] → [{x, y}, ...], dropping malformed pairs.
function points(history, yIndex) {
  const out = [];
  for (const entry of array(history)) {
    if (!Array.isArray(entry)) continue;
    const x = entry[0], y = entry[yIndex];
    if (typeof x === "number" && typeof y === "number" && isFinite(x) && isFinite(y)) out.push({ x, y });
  }
  return out;
}

function setDatasets(chart, datasets) {
  chart.data.datasets = datasets;
  chart.update("none");
  let drawn = 0;
  chart.data.datasets.forEach((_, i) => { drawn += chart.getDatasetMeta(i).data.length; });
  chart.canvas.setAttribute("data-points", String(drawn));
}

function lineDataset(label, index, data) {
  return { label, data, borderColor: color(index), backgroundColor: color(index) };
}

function drawCharts(state) {
  const clusters = array(state.clusters);
  setDatasets(charts.loss, clusters.map((c, i) =>
    lineDataset("cluster " + c.id, i, points(c.loss_history, 1))));
  setDatasets(charts.throughput, clusters.map((c, i) =>
    lineDataset("cluster " + c.id, i, points(c.throughput_history, 1))));
  // One line per (cluster, evaluation name): [[step, name, value], ...].
  const evals = [];
  clusters.forEach((c, i) => {
    const byName = new Map();
    for (const entry of array(c.eval_history)) {
      if (!Array.isArray(entry) || typeof entry[0] !== "number" || typeof entry[2] !== "number") continue;
      const name = String(entry[1]);
      if (!byName.has(name)) byName.set(name, []);
      byName.get(name).push({ x: entry[0], y: entry[2] });
    }
    let k = 0;
    for (const [name, data] of byName) {
      const set = lineDataset("cluster " + c.id + " " + name, i, data);
      set.borderDash = k++ % 2 ? [6, 3] : [];
      evals.push(set);
    }
  });
  setDatasets(charts.eval, evals);
  const nodes = array(state.nodes).filter((n) =>
    [n.compute_s, n.send_s, n.wait_s].some((v) => typeof v === "number"));
  const split = charts.split;
  split.data.labels = nodes.map((n) => short(String(n.name)));
  ["compute_s", "send_s", "wait_s"].forEach((key, i) => {
    split.data.datasets[i].data = nodes.map((n) => (typeof n[key] === "number" ? n[key] : 0));
  });
  setDatasets(split, split.data.datasets);
}

// ---- clusters, nodes, events ----------------------------------------------------------------

function drawSummary(state) {
  const run = state.run || {};
  const parts = [
    "phase " + (run.phase === undefined ? "–" : String(run.phase)),
    (run.num_clusters ?? "–") + " cluster(s)",
    (run.members ?? "–") + " member(s)",
    "running " + duration(typeof run.now === "number" && typeof run.started_at === "number"
                          ? run.now - run.started_at : null),
    (run.records ?? 0) + " records" + (run.dropped ? " (" + run.dropped + " dropped)" : ""),
  ];
  document.getElementById("run-summary").textContent = parts.join(" · ");
}

function nodeBox(name, node) {
  const state = node ? node.state : undefined;
  const box = el("span", "node " + stateClass(state), name);
  box.setAttribute("data-node", String(name));
  box.setAttribute("title", String(name) + ": " + (state === undefined ? "unknown" : String(state)) +
                   (node && node.address ? " at " + String(node.address) : ""));
  if (node && node.role) box.appendChild(el("span", "role", node.role));
  return box;
}

function drawClusters(state) {
  const byName = new Map(array(state.nodes).map((n) => [String(n.name), n]));
  const host = document.getElementById("clusters");
  const fresh = document.createDocumentFragment();
  for (const c of array(state.clusters)) {
    const block = el("div", "cluster");
    block.setAttribute("data-cluster", String(c.id));
    block.appendChild(el("span", "cluster-title", "cluster " + c.id));
    const steps = typeof c.max_steps === "number" ? c.step + " / " + c.max_steps : String(c.step);
    block.appendChild(el("span", "cluster-figures",
      "step " + steps + " · loss " + num(c.loss, 4) + " · " + num(c.samples_per_s, 1) +
      " samples/s · ETA " + duration(c.eta_s)));
    const chain = el("div", "chain");
    array(c.nodes).forEach((name, i) => {
      if (i > 0) chain.appendChild(el("span", "arrow", "→"));
      chain.appendChild(nodeBox(String(name), byName.get(String(name))));
    });
    block.appendChild(chain);
    fresh.appendChild(block);
  }
  const spares = array(state.nodes).filter((n) => n.role === "spare");
  if (spares.length) {
    const block = el("div", "cluster");
    block.setAttribute("data-cluster", "spares");
    block.appendChild(el("span", "cluster-title", "spares"));
    const chain = el("div", "chain");
    for (const n of spares) chain.appendChild(nodeBox(String(n.name), n));
    block.appendChild(chain);
    fresh.appendChild(block);
  }
  host.replaceChildren(fresh);
}

function drawLegend() {
  const legend = document.getElementById("legend");
  for (const [label, cls] of [["running", "ok"], ["starting / paused", "wait"],
                              ["lost / replaced", "bad"], ["done", "done"], ["spare", "spare"]])
    legend.appendChild(el("span", "node state-" + cls, label));
}

function drawNodes(state) {
  const body = document.querySelector("#nodes tbody");
  const rows = document.createDocumentFragment();
  for (const n of array(state.nodes)) {
    const row = el("tr");
    row.setAttribute("data-node", String(n.name));
    const cells = [n.name, n.cluster ?? "–", n.stage ?? "–", n.role, n.state, n.address,
                   typeof n.heartbeat_age_s === "number" ? num(n.heartbeat_age_s, 1) + " s" : "–",
                   n.step ?? "–", num(n.compute_s, 4), num(n.send_s, 4), num(n.wait_s, 4)];
    cells.forEach((value, i) => {
      const cell = el("td", i === 4 ? stateClass(n.state) : "", value === undefined ? "–" : value);
      row.appendChild(cell);
    });
    rows.appendChild(row);
  }
  body.replaceChildren(rows);
}

// Links (VolunteerRelays.h linksView): how many are direct, dial-out or relayed, every link that
// is not direct; the relays, the volunteers' (their heartbeats) and the coordinator's (--relay).
function drawLinks(state) {
  const links = state.links || {};
  const summary = document.getElementById("links-summary");
  summary.textContent = typeof links.direct === "number"
    ? `${links.direct} direct, ${links.dial_out} opened by a dial-out-only volunteer, ${links.relayed} relayed`
    : "no plan yet";
  const body = document.querySelector("#links tbody");
  const rows = document.createDocumentFragment();
  for (const l of array(links.not_direct)) {
    const row = el("tr");
    for (const value of [l.a, l.b, l.via]) row.appendChild(el("td", "", value === undefined ? "–" : value));
    rows.appendChild(row);
  }
  body.replaceChildren(rows);
  const relays = array(state.relays).slice();
  if (state.relay && typeof state.relay === "object")
    relays.push(Object.assign({}, state.relay, {
      name: "coordinator", address: "(--relay)", alive: true,
      refused: Object.values(state.relay.refused || {}).reduce((a, b) => a + Number(b), 0),
      links: array(links.not_direct).filter((l) => l.via === "coordinator").length}));
  const relayBody = document.querySelector("#relays tbody");
  const relayRows = document.createDocumentFragment();
  for (const r of relays) {
    const row = el("tr");
    row.setAttribute("data-relay", String(r.name));
    const mb = (v) => (typeof v === "number" ? num(v / 1e6, 1) : "–");
    for (const value of [r.name, r.address, r.alive ? "yes" : "lost", r.links, mb(r.bytes_forwarded),
                         r.messages_forwarded, mb(r.bytes_waiting), r.refused])
      row.appendChild(el("td", "", value === undefined ? "–" : value));
    relayRows.appendChild(row);
  }
  relayBody.replaceChildren(relayRows);
}

// Credit (coordinator/Credit.h): per volunteer and node, what the run kept of what it gave.
function drawCredit(state) {
  const body = document.querySelector("#credit tbody");
  const rows = document.createDocumentFragment();
  for (const c of array(state.credit)) {
    const row = el("tr");
    row.setAttribute("data-volunteer", String(c.volunteer));
    row.setAttribute("data-credit-node", String(c.node));
    const mb = typeof c.sent_bytes === "number" ? num(c.sent_bytes / 1e6, 1) : "–";
    for (const value of [c.volunteer, short(String(c.key)), c.node, c.steps, c.samples,
                         num(c.compute_s, 1), mb])
      row.appendChild(el("td", "", value === undefined ? "–" : value));
    rows.appendChild(row);
  }
  body.replaceChildren(rows);
}

function drawEvents(state) {
  const list = document.getElementById("events");
  const items = document.createDocumentFragment();
  const events = array(state.events).slice(-MAX_EVENTS).reverse();
  for (const e of events) {
    const item = el("li");
    item.appendChild(el("span", "time", clockTime(e.t)));
    item.appendChild(el("span", "kind", e.kind));
    if (e.node) item.appendChild(el("span", "who", e.node));
    item.appendChild(el("span", "message", e.message));
    items.appendChild(item);
  }
  list.replaceChildren(items);
}

// ---- polling --------------------------------------------------------------------------------

let polls = 0;

function setStatus(ok, text) {
  const status = document.getElementById("status");
  status.setAttribute("data-ok", ok ? "true" : "false");
  status.setAttribute("data-polls", String(polls));
  status.textContent = text;
}

async function poll() {
  try {
    const response = await fetch("/api/state", { cache: "no-store" });
    if (!response.ok) throw new Error("HTTP " + response.status);
    const state = await response.json();
    drawSummary(state);
    drawClusters(state);
    drawNodes(state);
    drawLinks(state);
    drawCredit(state);
    drawEvents(state);
    drawCharts(state);
    polls += 1;
    setStatus(true, "updated " + new Date().toLocaleTimeString([], { hour12: false }));
  } catch (error) {
    setStatus(false, "no answer from the coordinator (" + error.message + "); retrying");
  }
  setTimeout(poll, POLL_MS);
}

function start() {
  drawLegend();
  makeCharts();
  poll();
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
