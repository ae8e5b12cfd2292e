// The vqueues web console: plain JavaScript, served by every node at /ui (no build, no CDN).
// It reads the same JSON API as the clients: the cluster map from this node, then each node's
// listing and readiness, and a queue's details from the node that owns it (a 409 wrong_node
// names the owner). Nodes allow these cross-origin calls only from the cluster's own node URLs.
"use strict";

const REFRESH_MS = 2000;
const PEEK = 10;
const state = { token: localStorage.getItem("vq-token") || "", map: null, timer: null,
                route: "", search: "", owners: new Map(), deleted: new Set() };

class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || "http_error";
    this.error = err;
  }
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function table(columns, rows, testid) {
  const numeric = columns.map((c) => c.endsWith("#"));
  return el("table", { "data-testid": testid },
    el("thead", {}, el("tr", {}, columns.map((c, i) =>
      el("th", { class: numeric[i] ? "num" : "" }, c.replace(/#$/, ""))))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((v, i) =>
      el("td", { class: numeric[i] ? "num" : "" }, v === null || v === undefined ? "–" : v))))));
}

function base(url) {
  return url === location.origin ? "" : url;
}

async function api(url, path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  if (options.body) headers["Content-Type"] = "application/json";
  const r = await fetch(base(url) + path, { ...options, headers });
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  if (r.status === 401) showTokenForm(true);
  if (!r.ok && !(r.status === 503 && path === "/readyz")) throw new ApiError(r.status, body);
  return body;
}

function q(name) {
  return encodeURIComponent(name);
}

// A call about one queue, sent to the node that owns it (learnt from 409 wrong_node).
async function routed(queue, path, options = {}) {
  const first = state.owners.get(queue) || location.origin;
  try {
    return await api(first, path, options);
  } catch (e) {
    if (e.code === "wrong_node" && e.error.owner && e.error.owner !== first) {
      state.owners.set(queue, e.error.owner);
      return api(e.error.owner, path, options);
    }
    throw e;
  }
}

async function clusterMap() {
  state.map = await api(location.origin, "/v1/partitions");
  return state.map;
}

function nodeUrls(map) {
  const urls = new Set(Object.values(map.owners).map((o) => o.url));
  if (urls.size === 0) urls.add(location.origin);
  return [...urls].sort();
}

function setStatus(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = bad ? "status error" : "status";
}

function showTokenForm(show) {
  document.getElementById("token-form").hidden = !show;
  if (show) document.getElementById("token-input").focus();
}

// Views -------------------------------------------------------------------------------------

async function clusterView(view) {
  const map = await clusterMap();
  const nodes = await Promise.all(nodeUrls(map).map(async (url) => {
    try {
      return { url, ...(await api(url, "/readyz")) };
    } catch (e) {
      return { url, status: "unreachable", error: e.message, owned: [], ready: [], details: [] };
    }
  }));
  const details = new Map();
  for (const n of nodes) for (const d of n.details || []) details.set(d.partition, [n, d]);
  const rows = [];
  let records = 0;
  let queues = 0;
  for (let p = 0; p < map.partitions; p++) {
    const owner = map.owners[String(p)];
    const [n, d] = details.get(p) || [null, null];
    if (!d) {
      rows.push([p, owner ? owner.node : "none", el("span", { class: "no" }, "no"), null, null,
                 null]);
      continue;
    }
    const span = d.replay_target === null ? 0 : d.replay_target - d.log_start;
    const replay = d.ready ? "done" : span > 0
      ? `${Math.min(100, Math.round((100 * (d.next_offset - d.log_start)) / span))}%`
      : "starting";
    records += d.next_offset - d.log_start;
    queues += d.queues;
    rows.push([p, n.node, el("span", { class: d.ready ? "yes" : "no" }, d.ready ? "yes" : "no"),
               d.queues, d.next_offset - d.log_start, replay]);
  }
  view.replaceChildren(
    el("h1", {}, "Cluster"),
    el("div", { class: "facts" },
      el("div", {}, el("b", { "data-testid": "partition-count" }, map.partitions), "partitions"),
      el("div", {}, el("b", { "data-testid": "node-count" }, nodes.length), "nodes"),
      el("div", {}, el("b", {}, queues), "queues"),
      el("div", {}, el("b", {}, records), "records"),
      el("div", {}, el("b", {}, map.generation), "generation")),
    el("h2", {}, "Nodes"),
    table(["Node", "URL", "Status", "Owned#", "Ready#"], nodes.map((n) => [
      n.node || "?", n.url,
      el("span", { class: n.status === "ready" ? "yes" : "no" }, n.status),
      (n.owned || []).length, (n.ready || []).length]), "nodes"),
    el("h2", {}, "Partitions"),
    table(["Partition#", "Owner", "Ready", "Queues#", "Records#", "Replay"], rows, "partitions"));
}

function queuesSkeleton(view) {
  const input = el("input", { type: "search", id: "search", placeholder: "search queues",
                              "aria-label": "search queues", value: state.search });
  input.addEventListener("input", () => { state.search = input.value; refresh(); });
  view.replaceChildren(el("h1", {}, "Queues"), el("p", {}, input),
                       el("div", { id: "queue-list" }));
  input.focus();
}

async function queuesView(view) {
  if (!view.querySelector("#queue-list")) queuesSkeleton(view);
  const map = await clusterMap();
  const all = [];
  for (const url of nodeUrls(map)) {
    let after = null;
    do {
      const params = new URLSearchParams({ stats: "true", limit: "1000" });
      if (after !== null) params.set("after", after);
      const page = await api(url, `/v1/queues?${params}`);
      for (const s of page.stats) state.owners.set(s.queue, url);
      all.push(...page.stats);
      after = page.next_after;
    } while (after !== null && all.length < 20000);
  }
  const needle = state.search.trim().toLowerCase();
  const shown = all.filter((s) => s.queue.toLowerCase().includes(needle))
    .sort((a, b) => (a.queue < b.queue ? -1 : a.queue > b.queue ? 1 : 0));
  const list = view.querySelector("#queue-list");
  list.replaceChildren(
    el("p", { "data-testid": "queue-count" }, `${shown.length} of ${all.length} queue(s)`),
    table(["Queue", "Partition#", "Records#", "Consumers#", "Worst lag#"], shown.map((s) => [
      el("a", { href: `#/queue/${q(s.queue)}` }, s.queue), s.partition, s.records, s.consumers,
      s.max_lag]), "queues"));
}

// Prefix consumers: each node counts its own partitions; the figures are summed.
async function workersView(view) {
  const map = await clusterMap();
  const merged = new Map();
  for (const url of nodeUrls(map)) {
    const body = await api(url, "/v1/prefix-consumers");
    for (const p of body.prefix_consumers) {
      const m = merged.get(p.consumer) ||
        { ...p, queues: 0, ready_queues: 0, in_flight: 0, backlog: 0 };
      for (const k of ["queues", "ready_queues", "in_flight", "backlog"]) m[k] += p[k];
      merged.set(p.consumer, m);
    }
  }
  const rows = [...merged.values()].sort((a, b) => (a.consumer < b.consumer ? -1 : 1));
  view.replaceChildren(el("h1", {}, "Workers"),
    el("p", {}, "Prefix consumers: one pool of workers for every queue under a prefix."),
    table(["Consumer", "Prefix", "Queues#", "Waiting#", "Backlog#", "In flight#",
           "Max in flight#", "Attempts#", "Dead letters"],
          rows.map((p) => [p.consumer, p.prefix, p.queues, p.ready_queues, p.backlog,
                           p.in_flight, p.max_in_flight, p.max_attempts, p.dead_letter_queue]),
          "workers"));
}

async function peek(queue, info) {
  if (info.last_offset === null) return [];
  let span = PEEK;
  for (;;) {
    const start = Math.max(info.first_offset, info.last_offset - span + 1);
    const page = await routed(queue,
      `/v1/queues/${q(queue)}/records?offset=${start}&limit=1000`);
    if (page.records.length >= PEEK || start <= info.first_offset || span > 1e7) {
      return page.records.slice(-PEEK).reverse();
    }
    span *= 10;
  }
}

async function queueView(view, queue) {
  if (state.deleted.has(queue)) return;
  let info;
  try {
    info = await routed(queue, `/v1/queues/${q(queue)}`);
  } catch (e) {
    if (e.status === 404) {
      view.replaceChildren(el("h1", {}, queue),
        el("p", { class: "banner", "data-testid": "not-found" },
           "No such queue: it has no records and no consumers."));
      return;
    }
    throw e;
  }
  const records = await peek(queue, info);
  const del = el("button", { class: "danger", type: "button", "data-testid": "delete" },
                 "Delete queue…");
  del.addEventListener("click", () => confirmDelete(queue));
  view.replaceChildren(
    el("h1", { "data-testid": "queue-name" }, queue),
    el("div", { class: "facts" },
      el("div", {}, el("b", { "data-testid": "records" }, info.records), "records"),
      el("div", {}, el("b", { "data-testid": "first-offset" }, info.first_offset ?? "–"),
         "first offset"),
      el("div", {}, el("b", { "data-testid": "last-offset" }, info.last_offset ?? "–"),
         "last offset"),
      el("div", {}, el("b", {}, info.partition), "partition"),
      el("div", {}, el("b", {}, info.scheduled), "scheduled")),
    el("h2", {}, "Consumers"),
    info.consumers.length
      ? table(["Consumer", "Mode", "Offset#", "Lag#", "In flight#", "Delayed#",
               "Dead-lettered#"], info.consumers.map((c) => [
        c.consumer, c.mode, c.offset, c.lag, c.in_flight, c.delayed, c.dead_lettered]),
      "consumers")
      : el("p", {}, "No consumers."),
    el("h2", {}, `Latest records`),
    records.length
      ? table(["Offset#", "Time", "Value"], records.map((r) => [
        r.offset, new Date(r.timestamp).toISOString(),
        el("pre", { class: "value" }, r.value === null ? "null" : r.value)]), "latest")
      : el("p", {}, "No records."),
    el("p", {}, del));
}

function confirmDelete(queue) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent =
    `Delete queue “${queue}” and its consumers? Its records become unreadable; this cannot ` +
    "be undone.";
  dialog.returnValue = "";
  dialog.onclose = async () => {
    if (dialog.returnValue !== "ok") return;
    try {
      const res = await routed(queue, `/v1/queues/${q(queue)}`, { method: "DELETE" });
      state.deleted.add(queue);
      document.getElementById("view").replaceChildren(
        el("h1", {}, queue),
        el("p", { class: "banner", "data-testid": "deleted" },
           `Deleted ${queue}: ${res.records} record(s) and ${res.consumers.length} consumer(s).`),
        el("p", {}, el("a", { href: "#/queues" }, "Back to the queues")));
    } catch (e) {
      setStatus(`delete failed: ${e.message}`, true);
    }
  };
  dialog.showModal();
}

// Routing and refresh ------------------------------------------------------------------------

function parseRoute() {
  const hash = location.hash.replace(/^#\/?/, "");
  if (hash.startsWith("queue/")) return ["queue", decodeURIComponent(hash.slice(6))];
  if (hash === "workers") return ["workers", null];
  return [hash === "queues" ? "queues" : "cluster", null];
}

let running = false;

async function refresh() {
  if (running) return;
  running = true;
  const [name, arg] = parseRoute();
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.nav === name || (name === "queue" &&
                                                              a.dataset.nav === "queues"));
  }
  const view = document.getElementById("view");
  try {
    if (name === "cluster") await clusterView(view);
    else if (name === "queues") await queuesView(view);
    else if (name === "workers") await workersView(view);
    else await queueView(view, arg);
    setStatus(`updated ${new Date().toLocaleTimeString()}`, false);
  } catch (e) {
    setStatus(e.status === 401 ? "a valid token is needed" : e.status === 403
      ? `forbidden: ${e.message}` : `error: ${e.message}`, true);
  } finally {
    running = false;
  }
}

function navigate() {
  const view = document.getElementById("view");
  view.replaceChildren();
  refresh();
}

document.getElementById("token-entry").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = document.getElementById("token-input").value.trim();
  localStorage.setItem("vq-token", state.token);
  document.getElementById("token-input").value = "";
  showTokenForm(false);
  navigate();
});
document.getElementById("token-clear").addEventListener("click", () => {
  state.token = "";
  localStorage.removeItem("vq-token");
  showTokenForm(true);
});
document.getElementById("token-button").addEventListener("click", () => showTokenForm(
  document.getElementById("token-form").hidden));
window.addEventListener("hashchange", navigate);
state.timer = setInterval(refresh, REFRESH_MS);
navigate();
