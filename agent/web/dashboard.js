// The autoscaler's dashboard: the job list and a job's charts, polled from the dashboard's JSON API.
// What the page shows is also kept in window.dashboard, so a browser test can read it.
"use strict";

window.dashboard = { updates: 0, series: {}, last: {}, decisions: 0 };
const page = document.body.dataset.page;

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function showError(message) {
  const box = document.getElementById("error");
  if (!box) return;
  box.hidden = !message;
  box.textContent = message || "";
}

async function pollAgents() {
  const holder = document.getElementById("agents");
  try {
    const { agents } = await getJSON("/api/agents");
    holder.replaceChildren(...agents.map(a => {
      const badge = el("span", `agent ${a.url}: ${a.status}`, `agent ${a.status}`);
      badge.title = a.detail;
      return badge;
    }));
    window.dashboard.agents = agents;
  } catch (err) {
    holder.replaceChildren(el("span", `dashboard unreachable: ${err.message}`, "agent unreachable"));
  }
}

// ---------------------------------------------------------------- the job list

const list = { page: 1, size: 50, q: "", total: 0 };

async function loadJobs() {
  const params = new URLSearchParams({ page: list.page, size: list.size, q: list.q });
  try {
    const data = await getJSON(`/api/jobs?${params}`);
    showError("");
    list.total = data.total;
    const body = document.querySelector("#jobs tbody");
    body.replaceChildren(...data.jobs.map(job => {
      const row = el("tr");
      const link = el("a", job.job_id);
      link.href = `/jobs/${encodeURIComponent(job.job_id)}`;
      const name = el("td"); name.append(link);
      const d = job.last_decision;
      const last = d ? `${d.clock} ${d.action} ${d.from} → ${d.to} (${d.code})` : "none yet";
      row.append(name, el("td", job.mode), el("td", job.policy), el("td", job.parallelism ?? "?"),
                 el("td", job.health, `health-${job.health.replace(" ", "-")}`), el("td", last));
      return row;
    }));
    const pages = Math.max(1, Math.ceil(data.total / list.size));
    document.getElementById("paging").textContent = `page ${list.page} of ${pages}, ${data.total} jobs`;
    Object.assign(window.dashboard, { jobs: data.jobs.length, total: data.total, page: list.page,
                                      updates: window.dashboard.updates + 1 });
    if (window.dashboard.readyAt === undefined) window.dashboard.readyAt = performance.now();
  } catch (err) {
    showError(`cannot load the jobs: ${err.message}`);
  }
}

function listPage() {
  document.getElementById("search").addEventListener("submit", e => { e.preventDefault(); });
  document.getElementById("q").addEventListener("input", e => { list.q = e.target.value; list.page = 1; loadJobs(); });
  document.getElementById("prev").addEventListener("click", () => { if (list.page > 1) { list.page--; loadJobs(); } });
  document.getElementById("next").addEventListener("click", () => {
    if (list.page * list.size < list.total) { list.page++; loadJobs(); }
  });
  loadJobs();
  setInterval(loadJobs, 5000);
}

// ---------------------------------------------------------------- a job

const COLORS = { arrival: "#2563eb", processed: "#16a34a", capacity: "#9333ea", forecast: "#f59e0b",
                 forecast_upper: "#fbbf24", forecast_untrusted: "rgba(107, 114, 128, 0.5)", parallelism: "#111827",
                 decisions: "#dc2626", backlog: "#0891b2", target: "#b91c1c", predicted: "#9333ea", observed: "#16a34a" };
const LABELS = { arrival: "arrival rate", processed: "processed rate", capacity: "predicted capacity",
                 forecast: "forecast", forecast_upper: "forecast upper band",
                 forecast_untrusted: "forecast, not trusted", parallelism: "parallelism",
                 decisions: "decisions", backlog: "backlog (records)", target: "backlog target (records)",
                 predicted: "predicted recovery (s)", observed: "observed recovery (s)" };
const CHARTS = [
  { key: "rates", title: "Records per second: load, processing, capacity and forecast" },
  { key: "parallelism", title: "Parallelism, with each decision marked", points: ["decisions"], stepped: true },
  { key: "backlog", title: "Backlog against its target" },
  { key: "recovery", title: "Recovery after a rescale: predicted and observed", points: ["predicted", "observed"] },
];
const job = { id: document.body.dataset.job, version: "", charts: {}, data: null };

function seriesOptions(chart, name) {
  const options = { label: LABELS[name] || name, stroke: COLORS[name] || "#555", width: 2, spanGaps: true };
  if (name === "forecast_upper") options.dash = [6, 4];
  if (name === "forecast_untrusted") Object.assign(options, { dash: [3, 5], width: 1.5 });
  if (chart.points && chart.points.includes(name)) {
    Object.assign(options, { paths: () => null, points: { show: true, size: 10, fill: COLORS[name] } });
  } else if (chart.stepped) {
    options.paths = uPlot.paths.stepped({ align: 1 });
  }
  return options;
}

function showDetail(d) {
  const box = document.getElementById("detail");
  box.textContent = `${d.clock} ${d.action} ${d.from} → ${d.to}` +
    (d.recommended !== null && d.recommended !== d.to ? ` (recommended ${d.recommended})` : "") +
    ` [${d.rule}/${d.code}] ${d.message} ${d.numbers}`;
  window.dashboard.shownDecision = d;
}

function markerAt(u) {
  const i = u.cursor.idx;
  if (i === null || i === undefined) return null;
  const x = u.data[0][i];
  return job.data.markers[x.toFixed(3)] || null;
}

function drawChart(chart, data) {
  const names = Object.keys(data).filter(n => n !== "x");
  const columns = [data.x, ...names.map(n => data[n])];
  const existing = job.charts[chart.key];
  if (existing) { existing.setData(columns); return; }
  const holder = el("div", null, "chart");
  holder.dataset.chart = chart.key;
  holder.append(el("h3", chart.title));
  document.getElementById("charts").append(holder);
  const width = Math.max(400, holder.clientWidth || 600);
  // The time axis spans the chart's own points (in seconds), and the recovery chart's few points span the
  // job's windows, as the others do. Not uPlot's min and max: for a single point its time scale adds
  // 86,400 / 0.001 s (a day taken for milliseconds), an axis of 1,000 days.
  const span = (u, min, max) => {
    const times = chart.key === "recovery" ? [...u.data[0], ...job.data.parallelism.x] : u.data[0];
    let lo = Infinity, hi = -Infinity;
    for (const t of times) { if (t !== null) { lo = Math.min(lo, t); hi = Math.max(hi, t); } }
    if (lo === Infinity) return [min, max];
    return lo === hi ? [lo - 60, hi + 60] : [lo, hi];
  };
  // The rates chart's y axis spans the measured rates (rates_range): a forecast beyond them is clipped.
  const scales = { x: { time: true, range: span } };
  if (chart.key === "rates") scales.y = { range: (u, min, max) => job.data.rates_range || [min, max] };
  const options = {
    width, height: 240, scales, axes: [{}, { size: 70 }],
    series: [{}, ...names.map(n => seriesOptions(chart, n))],
    hooks: chart.key === "parallelism" ? { setCursor: [u => { const d = markerAt(u); if (d) showDetail(d); }] } : {},
  };
  const plot = new uPlot(options, columns, holder);
  if (chart.key === "rates") holder.append(el("p", null, "forecast-note"));  // which forecast, and why
  if (chart.key === "parallelism") {
    plot.over.addEventListener("click", () => { const d = markerAt(plot); if (d) showDetail(d); });
  }
  job.charts[chart.key] = plot;
  window.dashboardCharts = job.charts;
}

function record(data) {
  const state = window.dashboard;
  for (const chart of CHARTS) {
    for (const [name, values] of Object.entries(data[chart.key])) {
      if (name === "x") continue;
      const present = values.filter(v => v !== null);
      state.series[name] = present.length;
      state.last[name] = present.length ? present[present.length - 1] : null;
    }
  }
  Object.assign(state, { windows: data.windows, decisions: data.decisions.length,
                         lastDecision: data.decisions[0] || null, lastWindowEnd: data.last_window_end,
                         markers: Object.keys(data.markers).length, ratesRange: data.rates_range,
                         forecastNote: data.forecast_note, updates: state.updates + 1 });
}

function render(data) {
  job.data = data;
  const s = data.summary;
  document.getElementById("title").textContent = `Job ${job.id}`;
  document.getElementById("summary").textContent =
    `mode ${s.mode} · policy ${s.policy} · parallelism ${s.parallelism ?? "?"} · health ${s.health} · ` +
    `${data.windows} windows · backlog target ${data.backlog_target_s} s of arrivals`;
  document.getElementById("empty").hidden = data.windows > 0;
  if (data.windows > 0) for (const chart of CHARTS) drawChart(chart, data[chart.key]);
  const note = document.querySelector(".forecast-note");
  if (note) { note.textContent = data.forecast_note || ""; note.hidden = !data.forecast_note; }
  const body = document.querySelector("#decisions tbody");
  body.replaceChildren(...data.decisions.map(d => {
    const row = el("tr", null, d.action !== "none" ? "action" : (d.suppressed ? "suppressed" : ""));
    row.append(...[d.clock, d.action, d.from, d.to, d.rule, d.code, d.message, d.numbers].map(v => el("td", v)));
    row.addEventListener("click", () => showDetail(d));
    return row;
  }));
  record(data);
}

async function pollJob() {
  try {
    const data = await getJSON(`/api/jobs/${encodeURIComponent(job.id)}?since=${encodeURIComponent(job.version)}`);
    showError("");
    if (data.unchanged) return;
    job.version = data.version;
    render(data);
    if (window.dashboard.readyAt === undefined) window.dashboard.readyAt = performance.now();
  } catch (err) {
    showError(`cannot load ${job.id}: ${err.message} (the charts show the last data received)`);
  }
}

function jobPage() {
  pollJob();
  setInterval(pollJob, 2000);
}

pollAgents();
setInterval(pollAgents, 5000);
if (page === "list") listPage();
if (page === "job") jobPage();
