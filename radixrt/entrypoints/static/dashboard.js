// radixrt's live cache page: polls /cache_tree and draws the radix tree, the KV pool, the
// queues and a few headline metrics as small time series kept in the page. No dependencies.
// Text from the server (previews, request ids) is only ever set as text, never as HTML.
"use strict";

const REFRESH_MS = 1500;
const HISTORY = 160; // samples kept per series (about four minutes)
const METRICS = [
  { key: "throughput", title: "Generation throughput", unit: "tok/s", digits: 1 },
  { key: "running", title: "Running requests", unit: "", digits: 0, second: "queued" },
  { key: "hitRate", title: "Prefix cache hit rate (since start)", unit: "%", digits: 1 },
  { key: "kvUsage", title: "KV pool in use", unit: "%", digits: 1 },
  // Speculative decoding: drafted tokens the model accepted; "–" while none were drafted.
  { key: "specAccept", title: "Speculative drafts accepted (since start)", unit: "%", digits: 1 },
  // Beam search: groups running; of the KV positions forked beams took, the share they
  // share with their parent rather than copy ("–" before the first fork).
  { key: "beamGroups", title: "Beam groups running", unit: "", digits: 0 },
  { key: "beamShared", title: "Beam KV shared, not copied (since start)", unit: "%", digits: 1 },
];

const history = [];
const openState = new Map(); // node id -> open, as the user left it
let lastTreeJson = "";
let paused = false;
let timer = null;
let generation = 0; // bumped by restart(): an older poll loop stops

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmt(n) {
  return Number(n).toLocaleString("en-US");
}

function pct(part, whole) {
  return whole > 0 ? (100 * part) / whole : 0;
}

function setStatus(text, isError) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.classList.toggle("error", Boolean(isError));
}

// -- polling ----------------------------------------------------------------------------
async function poll() {
  const mine = generation;
  const url = new URL("/cache_tree", location.origin); // never the page's own credentials
  url.searchParams.set("depth", document.getElementById("depth").value || "6");
  url.searchParams.set("max_nodes", document.getElementById("max-nodes").value || "200");
  try {
    const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      const message = (body.error && body.error.message) || response.statusText;
      const hint = response.status === 401 ? " (reload and give the API key as the password)" : "";
      setStatus(`Error ${response.status}: ${message}${hint}`, true);
    } else {
      render(body);
      setStatus(`Updated ${new Date().toLocaleTimeString()}`, false);
    }
  } catch (error) {
    setStatus(`The server did not answer: ${error}`, true);
  }
  if (!paused && mine === generation) timer = setTimeout(poll, REFRESH_MS);
}

function render(data) {
  record(data);
  renderMetrics();
  renderPool(data.kv_pool);
  renderRequests(data.requests);
  renderTree(data);
}

// -- headline metrics -------------------------------------------------------------------
function record(data) {
  const now = performance.now() / 1000;
  const stats = data.stats || {};
  const reqs = data.requests;
  const produced = (stats.generated_tokens || 0) + reqs.running_output_tokens;
  const prev = history[history.length - 1];
  const elapsed = prev ? now - prev.t : 0;
  history.push({
    t: now,
    produced,
    throughput: prev && elapsed > 0 ? Math.max(produced - prev.produced, 0) / elapsed : 0,
    running: reqs.num_running,
    queued: reqs.num_queued,
    hitRate: 100 * (stats.cache_hit_rate || 0),
    kvUsage: pct(data.kv_pool.in_use_pages, data.kv_pool.pages),
    specAccept: stats.spec_draft_tokens
      ? 100 * (stats.spec_accepted_tokens || 0) / stats.spec_draft_tokens
      : null,
    beamGroups: stats.beam_groups || 0,
    beamShared: beamShare(stats),
  });
  if (history.length > HISTORY) history.shift();
}

function beamShare(stats) {
  const shared = stats.beam_shared_tokens || 0;
  const total = shared + (stats.beam_copied_tokens || 0);
  return total ? 100 * shared / total : null;
}

function renderMetrics() {
  const box = document.getElementById("metrics");
  if (!box.childElementCount) {
    for (const m of METRICS) {
      box.append(
        el("figure", { class: "metric", id: `metric-${m.key}` },
          el("h3", {}, m.title),
          el("div", { class: "value" }, "–"),
          el("canvas", { role: "img", "aria-label": m.title, width: 260, height: 60 })),
      );
    }
  }
  const last = history[history.length - 1];
  for (const m of METRICS) {
    const card = document.getElementById(`metric-${m.key}`);
    let text = last[m.key] === null ? "–" : `${last[m.key].toFixed(m.digits)} ${m.unit}`.trim();
    if (m.second) text += `, ${last[m.second]} ${m.second}`;
    card.querySelector(".value").textContent = text;
    const series = history.map((h) => h[m.key] || 0);
    const canvas = card.querySelector("canvas");
    const peak = Math.max(...series, m.unit === "%" ? 100 : 1);
    canvas.setAttribute("aria-label", `${m.title}: now ${text}, peak ${peak.toFixed(m.digits)}`);
    drawSeries(canvas, [series, m.second ? history.map((h) => h[m.second]) : null], peak);
  }
}

function drawSeries(canvas, seriesList, peak) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 260;
  const height = canvas.clientHeight || 60;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const styles = [["#2c6fad", []], ["#b5452b", [4, 3]]]; // the second series is dashed
  seriesList.forEach((series, i) => {
    if (!series || series.length < 2) return;
    ctx.strokeStyle = styles[i][0];
    ctx.setLineDash(styles[i][1]);
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    const offset = HISTORY - series.length; // the newest sample sits at the right edge
    series.forEach((v, j) => {
      const x = ((offset + j) / (HISTORY - 1)) * width;
      const y = height - 2 - (v / peak) * (height - 4);
      if (j === 0) ctx.moveTo(x, y);
      else ctx.lineTo(x, y);
    });
    ctx.stroke();
  });
}

// -- KV pool ----------------------------------------------------------------------------
function renderPool(pool) {
  const parts = [
    ["in-use", "In use by running requests", pool.in_use_pages, pool.in_use_tokens],
    ["cached", "Cached (evictable)", pool.cached_pages, pool.cached_tokens],
    ["free", "Free", pool.free_pages, pool.free_tokens],
  ];
  const bar = document.getElementById("pool-bar");
  const legend = document.getElementById("pool-legend");
  bar.replaceChildren();
  legend.replaceChildren();
  const words = [];
  for (const [key, label, pages, tokens] of parts) {
    const share = pct(pages, pool.pages);
    const text = `${label}: ${fmt(pages)} pages, ${fmt(tokens)} tokens (${share.toFixed(1)}%)`;
    words.push(text);
    const seg = el("div", { class: `seg seg-${key}`, title: text, "data-pages": pages },
      share >= 8 ? `${label.split(" ")[0]} ${share.toFixed(0)}%` : "");
    seg.style.width = `${share}%`;
    bar.append(seg);
    legend.append(el("li", { class: `legend-${key}` }, el("span", { class: `swatch seg-${key}` }), text));
  }
  legend.append(el("li", {}, `Page size ${pool.page_size} tokens; pool ${fmt(pool.pages)} pages`));
  bar.setAttribute("aria-label", `KV pool of ${fmt(pool.pages)} pages: ${words.join("; ")}`);
}

// -- requests ---------------------------------------------------------------------------
function renderRequests(reqs) {
  fillTable("running", reqs.running, reqs.num_running);
  fillTable("queued", reqs.queued, reqs.num_queued);
}

function fillTable(id, rows, total) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  if (!rows.length) body.append(el("tr", {}, el("td", { colspan: 4, class: "empty" }, "none")));
  for (const r of rows) {
    const hit = `${fmt(r.cached_tokens)} (${pct(r.cached_tokens, r.prompt_tokens).toFixed(0)}%)`;
    body.append(el("tr", {}, el("td", {}, el("code", {}, r.rid)), el("td", {}, fmt(r.prompt_tokens)),
      el("td", {}, hit), el("td", {}, fmt(r.output_tokens))));
  }
  if (total > rows.length) {
    body.append(el("tr", {}, el("td", { colspan: 4, class: "more" }, `+${fmt(total - rows.length)} more`)));
  }
}

// -- radix tree -------------------------------------------------------------------------
function renderTree(data) {
  const summary = document.getElementById("tree-summary");
  const box = document.getElementById("tree");
  if (!data.radix_cache) {
    summary.textContent = "The radix cache is disabled (--disable-radix-cache): nothing is shared.";
    box.replaceChildren();
    return;
  }
  const tree = data.tree;
  const json = JSON.stringify(tree);
  if (json === lastTreeJson) return; // unchanged: keep the DOM (and the reader's place)
  lastTreeJson = json;
  summary.textContent =
    `${fmt(tree.total_tokens)} tokens in ${fmt(tree.total_nodes)} nodes; showing ` +
    `${fmt(tree.nodes_shown)} (depth ≤ ${tree.depth}, at most ${tree.max_nodes}), ` +
    `biggest subtrees first` + (tree.complete ? "." : "; sizes below the counted part are lower bounds.");
  box.replaceChildren(el("ul", { "aria-label": "Radix tree" }, nodeItem(tree.root, 0)));
}

function nodeItem(node, level) {
  const line = nodeLine(node, level);
  const kids = node.children.map((c) => nodeItem(c, level + 1));
  if (node.more) {
    kids.push(el("li", { class: "more" },
      `+${fmt(node.more.nodes)} more nodes, ${fmt(node.more.tokens)} tokens`));
  }
  if (!kids.length) return el("li", { class: "node", "data-node-id": node.id }, line);
  const isOpen = openState.has(node.id) ? openState.get(node.id) : level < 3;
  const details = el("details", isOpen ? { open: "" } : {}, el("summary", {}, line),
    el("ul", {}, ...kids));
  details.addEventListener("toggle", () => openState.set(node.id, details.open));
  return el("li", { class: "node", "data-node-id": node.id }, details);
}

function nodeLine(node, level) {
  if (level === 0) {
    return el("span", { class: "node-line" }, el("strong", {}, "root"),
      el("span", { class: "meta subtree" }, `${fmt(node.subtree_tokens)} tokens cached`));
  }
  const preview = node.preview !== null && node.preview !== undefined
    ? node.preview + (node.tokens > node.preview_ids.length ? "…" : "")
    : `ids ${node.preview_ids.join(" ")}`;
  const access = node.last_access_s === null ? "" : node.lock_ref > 0 ? "in use"
    : `last used ${node.last_access_s.toFixed(1)} s ago`;
  return el("span", { class: "node-line" },
    el("code", { class: "preview" }, preview),
    el("span", { class: "meta tokens" }, `${fmt(node.tokens)} tok`),
    el("span", { class: "meta subtree" },
      `subtree ${fmt(node.subtree_tokens)} tok / ${fmt(node.subtree_nodes)} nodes` +
      (node.counted ? "" : " (not counted further)")),
    el("span", { class: "meta lock" }, `lock ${node.lock_ref}`),
    el("span", { class: "meta access" }, access),
    el("span", { class: node.evictable ? "badge evictable" : "badge locked" },
      node.evictable ? "evictable" : "locked"));
}

// -- controls ---------------------------------------------------------------------------
function restart() {
  clearTimeout(timer);
  generation += 1;
  lastTreeJson = "";
  if (!paused) poll();
}

document.addEventListener("DOMContentLoaded", () => {
  const pause = document.getElementById("pause");
  pause.addEventListener("click", () => {
    paused = !paused;
    pause.textContent = paused ? "Resume" : "Pause";
    pause.setAttribute("aria-pressed", String(paused));
    restart();
  });
  for (const id of ["depth", "max-nodes"]) document.getElementById(id).addEventListener("change", restart);
  document.getElementById("controls").addEventListener("submit", (e) => e.preventDefault());
  poll();
});
