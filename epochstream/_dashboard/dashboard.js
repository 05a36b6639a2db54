// The epochstream dashboard: polls /api/state every second and draws, per topic, its
// partitions' frontiers over time and its readers' lag over time (uPlot), and browses the
// retained epochs (/api/epochs, /api/epoch). No framework, no network beyond this server.
"use strict";

const charts = {};          // id -> {plot, keys}
let browse = {topic: null, time: null, page: 0, size: 50, total: 0};

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function fmt(frontier) {
  if (frontier === null || frontier === undefined) return "–";
  return "[" + frontier.map(t => Array.isArray(t) ? "(" + t.join(", ") + ")" : t).join(", ") + "]";
}

function slug(s) { return s.replace(/[^A-Za-z0-9_-]/g, "_"); }

// one chart per id; created once, then fed new data (uPlot.setData). ``units``: one y axis per
// unit (left, then right), each series on the axis of its unit (default: the first)
function chart(container, id, title, labels, data, units, unitOf) {
  const keys = labels.join("|");
  let c = charts[id];
  if (c && c.keys !== keys) { c.plot.destroy(); c.box.remove(); c = null; }
  if (!c) {
    const box = el("div", {id: id, class: "chart"});
    container.append(box);
    const palette = ["#2d6cdf", "#d9480f", "#2b8a3e", "#862e9c", "#c92a2a", "#0b7285"];
    const series = [{}].concat(labels.map((l, i) => ({label: l, stroke: palette[i % palette.length],
                                                       width: 2, spanGaps: false,
                                                       scale: (unitOf || [])[i] || units[0]})));
    const axes = [{}].concat(units.map((u, i) => ({scale: u, label: u, side: i ? 1 : 3,
                                                   grid: {show: i === 0}})));
    const scales = {x: {time: true}};
    for (const u of units) scales[u] = {auto: true};
    const plot = new uPlot({title: title, width: 460, height: 200, series: series, axes: axes,
                            scales: scales}, data, box);
    c = charts[id] = {plot: plot, keys: keys, box: box};
  } else {
    c.plot.setData(data);
  }
  c.box.dataset.points = String(data[0].length);
  return c;
}

function topicSection(t) {
  const id = "topic-" + slug(t.name);
  let sec = document.getElementById(id);
  if (!sec) {
    sec = el("div", {id: id, class: "topic"}, el("h3", {}, t.name),
             el("div", {class: "readers"}), el("div", {class: "charts"}));
    document.getElementById("charts").append(sec);
  }
  return sec;
}

function drawTopic(t) {
  const sec = topicSection(t);
  const box = sec.querySelector(".charts");
  if (t.partitions.length) {
    // the partitions' samples share their times; one that appeared later has fewer
    const xs = t.partitions.reduce((a, p) => (p.series.t || []).length > a.length
                                              ? p.series.t : a, []);
    const data = [xs].concat(t.partitions.map(p => {
      const at = new Map((p.series.t || []).map((x, i) => [x, p.series.lower[i]]));
      return xs.map(x => at.has(x) ? at.get(x) : null);
    }));
    chart(box, "frontier-" + slug(t.name), "lower frontier (epoch) over time",
          t.partitions.map(p => "partition " + p.partition), data, ["epoch"]);
  }
  const readers = sec.querySelector(".readers");
  readers.replaceChildren(...t.readers.map(r => el("div", {class: "reader",
      "data-name": r.name, "data-lag-epochs": r.lag_epochs},
    el("span", {class: "status status-" + r.status}, r.status), " ",
    `${r.kind} ${r.name}: lag ${r.lag_epochs} epochs, ${r.lag_seconds.toFixed(1)} s`,
    r.state !== "active" ? ` (${r.state})` : "")));
  for (const r of t.readers) {
    const s = r.series;
    chart(box, "lag-" + slug(t.name) + "-" + slug(r.kind + "-" + r.name),
          `${r.kind} ${r.name}: lag over time`, ["lag (epochs)", "lag (seconds)"],
          [s.t || [], s.lag_epochs || [], s.lag_seconds || []], ["epochs", "seconds"],
          ["epochs", "seconds"]);
  }
}

function drawTopics(state) {
  const body = document.querySelector("#topics tbody");
  body.replaceChildren(...state.topics.map(t => {
    const worst = t.readers.reduce((m, r) => Math.max(m, r.lag_epochs), 0);
    return el("tr", {"data-topic": t.name}, el("td", {}, t.name), el("td", {}, t.order),
              el("td", {}, t.partitions.length), el("td", {}, fmt(t.lower)),
              el("td", {}, fmt(t.upper)), el("td", {}, t.readers.length),
              el("td", {}, t.readers.length ? worst + " epochs" : "–"));
  }));
  const select = document.getElementById("browse-topic");
  const names = state.topics.map(t => t.name);
  if (select.dataset.names !== names.join("|")) {
    select.dataset.names = names.join("|");
    select.replaceChildren(el("option", {value: ""}, "—"),
                           ...names.map(n => el("option", {value: n}, n)));
    if (browse.topic) select.value = browse.topic;
  }
}

async function poll() {
  try {
    const r = await fetch("/api/state");
    const state = await r.json();
    document.getElementById("catalog").textContent = state.catalog || "";
    document.getElementById("samples").textContent = state.samples;
    document.getElementById("updated").textContent =
      state.at ? "updated " + new Date(state.at * 1000).toLocaleTimeString() : "no sample yet";
    drawTopics(state);
    for (const t of state.topics) drawTopic(t);
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach the server: " + e;
  }
}

async function loadEpochs(topic) {
  browse = {topic: topic, time: null, page: 0, size: 50, total: 0};
  const select = document.getElementById("browse-epoch");
  select.replaceChildren();
  document.getElementById("browse-error").textContent = "";
  if (!topic) return;
  const r = await fetch("/api/epochs?topic=" + encodeURIComponent(topic));
  const body = await r.json();
  if (body.error) { document.getElementById("browse-error").textContent = body.error; return; }
  select.replaceChildren(el("option", {value: ""}, "—"),
    ...body.epochs.map(e => el("option", {value: JSON.stringify(e.time)},
                               `${JSON.stringify(e.time)} (${e.bytes} bytes)`)));
}

async function loadPage() {
  const error = document.getElementById("browse-error");
  error.textContent = "";
  if (!browse.topic || browse.time === null) return;
  const q = `topic=${encodeURIComponent(browse.topic)}&time=${encodeURIComponent(browse.time)}` +
            `&page=${browse.page}&size=${browse.size}`;
  const body = await (await fetch("/api/epoch?" + q)).json();
  const table = document.getElementById("records");
  if (body.error) { error.textContent = body.error; table.tHead.replaceChildren();
                    table.tBodies[0].replaceChildren(); return; }
  browse.total = body.total;
  const cols = [];
  for (const rec of body.records) {
    if (rec && typeof rec === "object" && !Array.isArray(rec)) {
      for (const k of Object.keys(rec)) if (!cols.includes(k)) cols.push(k);
    }
  }
  const row = rec => cols.length ? cols.map(c => el("td", {}, JSON.stringify(rec[c] ?? null)))
                                 : [el("td", {}, JSON.stringify(rec))];
  table.tHead.replaceChildren(el("tr", {}, ...(cols.length ? cols : ["record"]).map(c =>
                                                                       el("th", {}, c))));
  table.tBodies[0].replaceChildren(...body.records.map(rec => el("tr", {}, ...row(rec))));
  const first = body.total ? body.page * body.size + 1 : 0;
  document.getElementById("page-info").textContent =
    `records ${first}–${body.page * body.size + body.records.length} of ${body.total}`;
}

document.getElementById("browse-topic").addEventListener("change", e => loadEpochs(e.target.value));
document.getElementById("browse-epoch").addEventListener("change", e => {
  browse.time = e.target.value || null; browse.page = 0; loadPage();
});
document.getElementById("prev").addEventListener("click", () => {
  if (browse.page > 0) { browse.page -= 1; loadPage(); }
});
document.getElementById("next").addEventListener("click", () => {
  if ((browse.page + 1) * browse.size < browse.total) { browse.page += 1; loadPage(); }
});

poll();
setInterval(poll, 1000);
