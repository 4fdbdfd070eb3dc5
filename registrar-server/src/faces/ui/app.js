// The registrar's dashboard: renders the events of /ui/events (a snapshot
// of every endpoint, in pages, then deltas, and the registrar's status
// each second). Everything is written with textContent: no value from the
// registry is ever parsed as HTML.
//
// Built to stay live with a large registry: the endpoint tables are
// rebuilt only when the endpoints or the filters change (not on the
// status tick), the sorted list and each endpoint's search text are kept
// between renders, and the endpoints table shows at most MAX_ROWS rows
// (the count says how many match: narrow them with the filter).
"use strict";

(function () {
  // Rows shown at most in the endpoints table.
  const MAX_ROWS = 500;
  let endpoints = new Map(); // "service/id" -> endpoint
  let pending = null; // the snapshot being received, page by page
  let status = null;
  let scheduled = false;
  // The endpoints changed, or the filters did, since the last render.
  let dirty = true;
  let sortedCache = null; // the endpoints in key order, until they change
  let nodeCounts = null; // node -> endpoints, until they change
  const hays = new WeakMap(); // endpoint -> its search text

  const $ = (id) => document.getElementById(id);
  const keyOf = (service, id) => service + "/" + id;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function badge(health) {
    return el("span", health, "badge " + (health === "healthy" ? "ok" : "bad"));
  }

  function setValue(id, text, cls) {
    const e = $(id);
    e.textContent = text;
    if (e.dataset.base === undefined) e.dataset.base = e.className;
    e.className = e.dataset.base + (cls ? " " + cls : "");
  }

  function ago(ms) {
    if (ms < 0) ms = 0;
    const s = Math.round(ms / 1000);
    if (s < 60) return s + " s ago";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " min " + (s % 60) + " s ago";
    const h = Math.floor(m / 60);
    return h + " h " + (m % 60) + " min ago";
  }

  function seconds(s) {
    if (s < 1) return (Math.round(s * 10) / 10) + " s";
    if (s < 120) return Math.round(s) + " s";
    return Math.round(s / 60) + " min";
  }

  // Re-render at most once a frame, however many events arrive.
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    window.requestAnimationFrame(() => {
      scheduled = false;
      render();
    });
  }

  // The endpoints (or the filters) changed: rebuild the tables.
  function changed() {
    sortedCache = null;
    nodeCounts = null;
    dirty = true;
    schedule();
  }

  function filtered() {
    dirty = true;
    schedule();
  }

  function sorted() {
    if (sortedCache === null) {
      sortedCache = Array.from(endpoints.values()).sort((a, b) =>
        a.service < b.service ? -1 : a.service > b.service ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
    }
    return sortedCache;
  }

  function labelsText(labels) {
    return Object.keys(labels || {}).sort().map((k) => k + "=" + labels[k]);
  }

  function hayOf(ep) {
    let hay = hays.get(ep);
    if (hay === undefined) {
      hay = [ep.service, ep.id, ep.address, String(ep.port), ep.protocol, ep.cluster,
        ep.node, ep.health].concat(labelsText(ep.labels)).join(" ").toLowerCase();
      hays.set(ep, hay);
    }
    return hay;
  }

  function matches(ep, words, health) {
    if (health && ep.health !== health) return false;
    if (words.length === 0) return true;
    const hay = hayOf(ep);
    return words.every((w) => hay.includes(w));
  }

  function renderEndpoints(all) {
    const words = $("filter").value.toLowerCase().split(/\s+/).filter((w) => w.length > 0);
    const health = $("health-filter").value;
    const body = el("tbody");
    let shown = 0;
    for (const ep of all) {
      if (!matches(ep, words, health)) continue;
      shown += 1;
      if (shown > MAX_ROWS) continue;
      const tr = el("tr", null, ep.health === "healthy" ? "healthy" : "unhealthy");
      tr.dataset.key = keyOf(ep.service, ep.id);
      tr.dataset.health = ep.health;
      tr.appendChild(el("td", ep.service));
      tr.appendChild(el("td", ep.id, "mono"));
      tr.appendChild(el("td", ep.address, "mono"));
      tr.appendChild(el("td", ep.port, "num"));
      tr.appendChild(el("td", ep.protocol));
      tr.appendChild(el("td", ep.cluster));
      tr.appendChild(el("td", ep.node || "–"));
      const h = el("td");
      h.appendChild(badge(ep.health));
      tr.appendChild(h);
      const l = el("td");
      for (const text of labelsText(ep.labels)) l.appendChild(el("span", text, "label-pill"));
      tr.appendChild(l);
      body.appendChild(tr);
    }
    $("endpoints").replaceChild(body, $("endpoints").tBodies[0]);
    const count = shown === all.length ? String(all.length) : shown + " of " + all.length;
    $("endpoints-count").textContent = shown > MAX_ROWS
      ? "(" + count + ", the first " + MAX_ROWS + " shown: filter to narrow)"
      : "(" + count + ")";
    $("endpoints-empty").hidden = shown !== 0;
  }

  function renderServices(all) {
    const services = new Map();
    for (const ep of all) {
      const s = services.get(ep.service) || { total: 0, healthy: 0 };
      s.total += 1;
      if (ep.health === "healthy") s.healthy += 1;
      services.set(ep.service, s);
    }
    const body = el("tbody");
    for (const [name, s] of services) {
      const tr = el("tr");
      tr.dataset.service = name;
      tr.appendChild(el("td", name));
      tr.appendChild(el("td", s.total, "num"));
      tr.appendChild(el("td", s.healthy, "num"));
      tr.appendChild(el("td", s.total - s.healthy, "num"));
      const h = el("td");
      if (s.healthy === s.total) h.appendChild(el("span", "healthy", "badge ok"));
      else if (s.healthy === 0) h.appendChild(el("span", "unhealthy", "badge bad"));
      else h.appendChild(el("span", "degraded", "badge pending"));
      tr.appendChild(h);
      body.appendChild(tr);
    }
    $("services").replaceChild(body, $("services").tBodies[0]);
    $("services-count").textContent = "(" + services.size + ")";
  }

  function renderNodes(all) {
    if (nodeCounts === null) {
      nodeCounts = new Map();
      for (const ep of all) {
        if (ep.node) nodeCounts.set(ep.node, (nodeCounts.get(ep.node) || 0) + 1);
      }
    }
    const nodes = new Map(nodeCounts);
    const beats = (status && status.heartbeats) || {};
    for (const node of Object.keys(beats)) if (!nodes.has(node)) nodes.set(node, 0);
    const body = el("tbody");
    for (const node of Array.from(nodes.keys()).sort()) {
      const tr = el("tr");
      tr.dataset.node = node;
      tr.appendChild(el("td", node));
      tr.appendChild(el("td", nodes.get(node), "num"));
      const at = beats[node];
      tr.appendChild(el("td", at === undefined ? "not seen here" : ago(status.now_ms - at)));
      body.appendChild(tr);
    }
    $("nodes").replaceChild(body, $("nodes").tBodies[0]);
    $("nodes-count").textContent = "(" + nodes.size + ")";
  }

  function renderStatus() {
    if (!status) return;
    setValue("st-ready", status.ready ? "ready" : "not ready", status.ready ? "ok" : "bad");
    if (!status.opened) {
      setValue("st-backend", "opening", "warn");
    } else if (status.backend_up) {
      setValue("st-backend", "up", "ok");
    } else {
      setValue("st-backend", "down " + seconds(status.backend_down_secs || 0), "bad");
    }
    setValue("st-agents", String(status.agent_streams));
    const cap = status.write_queue_capacity;
    const depth = status.write_queue_depth;
    setValue("st-queue", depth + (cap ? " / " + cap : ""), cap && depth > cap * 0.8 ? "bad" : "");
    setValue("st-age", status.cache_age_secs === null || status.cache_age_secs === undefined
      ? "–" : (status.cache_age_secs === 0 ? "live" : seconds(status.cache_age_secs)),
      status.cache_age_secs > 30 ? "warn" : "");
    setValue("st-epoch", status.epoch === null || status.epoch === undefined ? "–" : String(status.epoch));
    setValue("st-version", status.version || "–");
    $("st-readiness").textContent = status.readiness;
  }

  function render() {
    const all = sorted();
    renderStatus();
    if (dirty) {
      dirty = false;
      renderServices(all);
      renderEndpoints(all);
    }
    renderNodes(all);
  }

  function setLink(text, cls) {
    const l = $("link");
    l.textContent = text;
    l.className = "badge " + cls;
  }

  function parse(e) {
    try {
      return JSON.parse(e.data);
    } catch (err) {
      return null;
    }
  }

  function connect() {
    const source = new EventSource("/ui/events");
    source.addEventListener("open", () => setLink("connected", "pending"));
    source.addEventListener("error", () => {
      pending = null; // a snapshot cut off is sent again whole
      setLink("reconnecting…", "bad");
    });
    source.addEventListener("status", (e) => {
      const s = parse(e);
      if (!s) return;
      status = s;
      if (!s.opened) setLink("backend not open", "pending");
      schedule();
    });
    // A snapshot's pages are gathered; the last replaces what is shown.
    source.addEventListener("snapshot", (e) => {
      const m = parse(e);
      if (!m) return;
      if (pending === null) pending = new Map();
      for (const ep of m.endpoints) pending.set(keyOf(ep.service, ep.id), ep);
      if (m.last === false) return;
      endpoints = pending;
      pending = null;
      setLink("live", "ok");
      changed();
    });
    source.addEventListener("upsert", (e) => {
      const m = parse(e);
      if (!m) return;
      endpoints.set(keyOf(m.endpoint.service, m.endpoint.id), m.endpoint);
      changed();
    });
    source.addEventListener("remove", (e) => {
      const m = parse(e);
      if (!m) return;
      endpoints.delete(keyOf(m.service, m.id));
      changed();
    });
    source.addEventListener("problem", (e) => {
      const m = parse(e);
      setLink("resyncing", "pending");
      if (m) $("st-readiness").textContent = "event stream: " + m.message;
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("filter").addEventListener("input", filtered);
    $("health-filter").addEventListener("change", filtered);
    connect();
  });
})();
