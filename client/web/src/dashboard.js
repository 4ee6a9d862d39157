// The operator's dashboard (/dashboard): live from /api/dashboard/stream
// (server-sent events, read through fetch so the admin token can travel in an
// Authorization header rather than in a URL), charts drawn by uPlot.
//
// The token comes from the URL fragment (#token=…, never sent to the server in
// the URL) or the form, and is kept in sessionStorage for this tab only.

import uPlot from "uplot";
import { formatFlops } from "./volunteer.js";

/** A table of the stream's history: rows of numbers, named by `fields`.
 *  @typedef {{fields: string[], rows: number[][]}} Table */
/** /api/status, the part the dashboard shows.
 *  @typedef {{job: {name: string, strategy: string, widths: number[]}, version: number,
 *    last_evaluation?: {accuracy?: number | null} | null, clients: number, throughput: {results_per_s: number},
 *    accepted_results: number, rejected_results: number, resent_results?: number,
 *    checkpoints: {written: number, last: number | null, restored_from: number | null},
 *    finished: {reason: string} | null, paused: boolean, lr?: Lr | null}} Status */
/** /api/status's `lr`: the next local task's lr multiplier and its parts (docs/operations.md).
 *  @typedef {{multiplier: number, concurrency: number, plateau: number,
 *    diverged_cap: number | null, diverged_cuts: number}} Lr */
/** @typedef {{seconds: number | null, by: string}} Left */
/** A client's row (coordinator/http/dashboard.py).
 *  @typedef {{client_id: number | string, name: string, kind: string, flops: number | null, tasks: number,
 *    accepted: number, rejected: Record<string, number>, resent: number, declined: number, expired: number, bytes_down: number,
 *    bytes_up: number, bytes_per_hour: number | null, mean_staleness: number | null, connected: boolean,
 *    left_reason: string | null}} ClientRow */
/** @typedef {{t: number, kind: string, text: string}} Event */
/** One server-sent update.
 *  @typedef {{status: Status, left: Left, clients: ClientRow[], events: Event[],
 *    history: {evaluations: Table, throughput: Table}}} Update */

/** A row of /api/credit (coordinator/http/creditroutes.py).
 *  @typedef {{rank: number, volunteer: string, name: string, flops: number, pending_flops: number,
 *    results: number, forfeited: number, excluded: boolean}} Credit */
/** /api/credit: a page of the leaderboard.
 *  @typedef {{total: number, offset: number, limit: number, total_flops: number, volunteers: Credit[]}} CreditPage */

/** The element `#id` of dashboard.html, of class `Type` (a missing one is our bug).
 *  @template {HTMLElement} T
 *  @param {string} id @param {new () => T} Type @returns {T} */
function element(id, Type) {
  const el = document.getElementById(id);
  if (!(el instanceof Type)) throw new Error(`dashboard: #${id} is not a ${Type.name}`);
  return el;
}
/** @param {string} id */
const $ = (id) => element(id, HTMLElement);
const TOKEN_KEY = "crowdgrad-admin-token";

/** What tests (and the curious) can read. */
const state = {
  updates: 0,
  /** @type {Status | null} */
  status: null,
  /** @type {Left | null} */
  left: null,
  /** @type {ClientRow[]} */
  clients: [],
  /** @type {Event[]} */
  events: [],
  connected: false,
  /** @type {CreditPage | null} the leaderboard's top rows, as last polled */
  credit: null,
};
Object.assign(globalThis, { dashboard: state });

/** @type {{t: number[], version: number[], accuracy: number[], loss: number[]}} */
const evals = { t: [], version: [], accuracy: [], loss: [] };
/** @type {{t: number[], rps: number[], bytesIn: number[], bytesOut: number[], inRate: number[], outRate: number[]}} */
const thru = { t: [], rps: [], bytesIn: [], bytesOut: [], inRate: [], outRate: [] };

function token() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromHash) sessionStorage.setItem(TOKEN_KEY, fromHash);
  return sessionStorage.getItem(TOKEN_KEY) ?? "";
}

// -- charts ---------------------------------------------------------------------

/** Axis labels for byte rates: 12 kB/s, not 12,000 cut to fit. */
/** @type {uPlot.Axis.DynamicValues} */
const rateValues = (u, vals) => vals.map((v) => (v == null ? "" : `${bytes(Math.round(v))}/s`));

/** @param {HTMLElement} el @param {string} title @param {uPlot.Series[]} series @param {uPlot.Scales} scales
 *  @param {uPlot.Axis.Values} [values] */
function chart(el, title, series, scales, xTime = true, values = undefined) {
  const width = Math.max(200, el.clientWidth || 560);
  /** @type {uPlot.Options} */
  const opts = {
    title,
    width,
    height: 220,
    scales: { x: { time: xTime }, ...scales },
    series: [{}, ...series],
    axes: [
      {},
      { scale: series[0].scale ?? "y", size: 70, ...(values ? { values } : {}) },
      ...(series.some((s) => s.scale === "loss") ? [{ scale: "loss", side: 1, grid: { show: false } }] : []),
    ],
    legend: { live: false },
  };
  return new uPlot(opts, [[], ...series.map(() => [])], el);
}

const charts = {
  version: chart($("chart-version"), "", [
    { label: "accuracy", stroke: "#2f6fdb", width: 2, scale: "acc" },
    { label: "loss", stroke: "#d9822b", width: 1.5, scale: "loss" },
  ], { acc: { range: [0, 1] }, loss: {} }, false),
  time: chart($("chart-time"), "", [{ label: "accuracy", stroke: "#2f6fdb", width: 2, scale: "acc" }], {
    acc: { range: [0, 1] },
  }),
  rps: chart($("chart-rps"), "", [{ label: "results/s", stroke: "#1f8a4c", width: 2 }], {}),
  bytes: chart($("chart-bytes"), "", [
    { label: "down (to clients)", stroke: "#2f6fdb", width: 1.5 },
    { label: "up (from clients)", stroke: "#b42318", width: 1.5 },
  ], {}, true, rateValues),
};

function redraw() {
  charts.version.setData([evals.version, evals.accuracy, evals.loss]);
  charts.time.setData([evals.t, evals.accuracy]);
  charts.rps.setData([thru.t, thru.rps]);
  charts.bytes.setData([thru.t, thru.outRate, thru.inRate]);
}

/** @param {Update["history"]} h */
function addHistory(h) {
  const ef = h.evaluations.fields;
  for (const r of h.evaluations.rows) {
    evals.t.push(r[ef.indexOf("t")]);
    evals.version.push(r[ef.indexOf("version")]);
    evals.accuracy.push(r[ef.indexOf("accuracy")]);
    evals.loss.push(r[ef.indexOf("loss")]);
  }
  const tf = h.throughput.fields;
  for (const r of h.throughput.rows) {
    const t = r[tf.indexOf("t")];
    const bin = r[tf.indexOf("bytes_in")];
    const bout = r[tf.indexOf("bytes_out")];
    const n = thru.t.length;
    const dt = n ? t - thru.t[n - 1] : 0;
    thru.inRate.push(n && dt > 0 ? Math.max(0, (bin - thru.bytesIn[n - 1]) / dt) : 0);
    thru.outRate.push(n && dt > 0 ? Math.max(0, (bout - thru.bytesOut[n - 1]) / dt) : 0);
    thru.t.push(t);
    thru.rps.push(r[tf.indexOf("results_per_s")]);
    thru.bytesIn.push(bin);
    thru.bytesOut.push(bout);
  }
}

// -- numbers, table, events ---------------------------------------------------------

/** @param {number} n */
function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} kB`;
  if (n < 1 << 30) return `${(n / (1 << 20)).toFixed(1)} MB`;
  return `${(n / (1 << 30)).toFixed(2)} GB`;
}

/** @param {number | null | undefined} s */
function duration(s) {
  if (s == null) return "unknown";
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

/** A reason or bound as words ("target accuracy", not target_accuracy: it wraps).
 *  @param {string} name */
function words(name) {
  return name.replaceAll("_", " ");
}

/** @param {string | number} text */
function cell(text) {
  const td = document.createElement("td");
  td.textContent = String(text);
  return td;
}

/** @param {Status} st @param {Left} left */
function showStatus(st, left) {
  $("job").textContent = `${st.job.name} · ${st.job.strategy} · ${st.job.widths.join("·")}`;
  $("version").textContent = String(st.version);
  const acc = st.last_evaluation?.accuracy;
  $("accuracy").textContent = acc == null ? "no evaluation yet" : `${(100 * acc).toFixed(2)}%`;
  $("clients").textContent = String(st.clients);
  $("rps").textContent = st.throughput.results_per_s.toFixed(1);
  const resent = st.resent_results ? ` · resent ${st.resent_results}` : "";
  $("results").textContent = `${st.accepted_results} · ${st.rejected_results}${resent}`;
  const ck = st.checkpoints;
  $("checkpoints").textContent = ck.written
    ? `${ck.written} (last v${ck.last})`
    : ck.restored_from != null ? `restored v${ck.restored_from}` : "none";
  showLr(st.lr ?? null);
  if (st.finished) {
    $("state").textContent = `finished: ${words(st.finished.reason)}`;
    $("left").textContent = "0 s";
    $("left-by").textContent = "";
  } else {
    $("state").textContent = st.paused ? "paused" : "training";
    $("left").textContent = left.seconds == null ? "unknown" : duration(left.seconds);
    $("left-by").textContent = left.seconds == null ? "" : `by ${words(left.by)}`;
  }
}

/** The tasks' lr: the multiplier on the job's lr, and why it is not 1.
 *  @param {Lr | null} lr */
function showLr(lr) {
  if (lr == null) {
    $("lr").textContent = "–";
    $("lr-why").textContent = "";
    return;
  }
  $("lr").textContent = `×${Number(lr.multiplier.toPrecision(3))}`;
  $("lr-why").textContent = lrWhy(lr);
}

/** What sets the multiplier: the crowd's concurrency, the plateau cuts, the
 *  divergence cap (only the parts in effect).
 *  @param {Lr} lr @returns {string} */
function lrWhy(lr) {
  const parts = [`concurrency ${lr.concurrency.toFixed(1)}`];
  if (lr.plateau < 1) parts.push(`plateau ×${Number(lr.plateau.toPrecision(3))}`);
  if (lr.diverged_cap != null) {
    const cuts = lr.diverged_cuts === 1 ? "1 cut" : `${lr.diverged_cuts} cuts`;
    parts.push(`diverged: cap ×${Number(lr.diverged_cap.toPrecision(3))} (${cuts})`);
  }
  return parts.join(" · ");
}

/** @param {ClientRow[]} rows */
function showClients(rows) {
  const body = element("clients-table", HTMLTableElement).tBodies[0];
  body.replaceChildren(
    ...rows
      .slice()
      .sort((a, b) => Number(b.connected) - Number(a.connected) || b.accepted - a.accepted)
      .slice(0, 500)
      .map((r) => {
        const tr = document.createElement("tr");
        if (!r.connected) tr.className = "gone";
        const refused = Object.entries(r.rejected).map(([k, v]) => `${k} ${v}`).join(", ") || "0";
        const rej = r.resent ? `${refused} · resent ${r.resent}` : refused;
        tr.append(
          cell(r.client_id), cell(r.name), cell(r.kind),
          cell(r.flops == null ? "–" : (r.flops / 1e9).toFixed(2)),
          cell(r.tasks), cell(r.accepted), cell(rej), cell(`${r.declined} · ${r.expired}`),
          cell(bytes(r.bytes_down)), cell(bytes(r.bytes_up)),
          cell(r.bytes_per_hour == null ? "–" : `${bytes(r.bytes_per_hour)}/h`),
          cell(r.mean_staleness ?? "–"),
          cell(r.connected ? "connected" : `left (${r.left_reason})`),
        );
        return tr;
      }),
  );
}

/** @param {Event[]} events */
function showEvents(events) {
  const list = $("events");
  for (const e of events) {
    const li = document.createElement("li");
    li.className = e.kind;
    li.textContent = `${new Date(e.t * 1000).toLocaleTimeString()} ${e.text}`;
    list.prepend(li);
  }
  for (let last = list.lastElementChild; last !== null && list.children.length > 200; last = list.lastElementChild) {
    last.remove();
  }
}

/** @param {Update} u */
function onUpdate(u) {
  state.updates += 1;
  state.status = u.status;
  state.left = u.left;
  state.clients = u.clients;
  state.events.push(...u.events);
  showStatus(u.status, u.left);
  showClients(u.clients);
  showEvents(u.events);
  addHistory(u.history);
  redraw();
}

// -- the leaderboard: /api/credit, public (no admin token), its own poll ---------------

const LEADERS = 10;
const CREDIT_POLL_MS = 3000;

/** @param {string} text @param {string} [small] a muted second line */
function cellWithNote(text, small) {
  const td = cell(text);
  if (small) {
    const s = document.createElement("small");
    s.textContent = small;
    td.append(s);
  }
  return td;
}

/** @param {CreditPage} page */
function showLeaderboard(page) {
  $("leaderboard-summary").textContent = page.total
    ? `${page.total} volunteer${page.total === 1 ? "" : "s"} · ${formatFlops(page.total_flops)} credited`
    : "";
  const body = element("leaderboard", HTMLTableElement).tBodies[0];
  if (!page.volunteers.length) {
    const td = cell("no volunteer has credit yet");
    td.colSpan = 4;
    td.className = "muted";
    const tr = document.createElement("tr");
    tr.append(td);
    body.replaceChildren(tr);
    return;
  }
  body.replaceChildren(
    ...page.volunteers.map((v) => {
      const tr = document.createElement("tr");
      tr.dataset.volunteer = v.volunteer;
      if (v.excluded) tr.className = "excluded";
      const who = cellWithNote(v.name, v.excluded ? `${v.volunteer} · excluded: caught lying` : v.volunteer);
      who.className = "who";
      const pending = v.pending_flops > 0 ? `+ ${formatFlops(v.pending_flops)} to check` : "";
      const lost = v.forfeited > 0 ? `${v.forfeited} forfeited` : "";
      tr.append(cell(v.rank), who, cellWithNote(formatFlops(v.flops), pending),
        cellWithNote(v.results.toLocaleString(), lost));
      return tr;
    }),
  );
}

async function pollCredit() {
  try {
    const res = await fetch(new URL(`api/credit?limit=${LEADERS}`, location.href), { cache: "no-store" });
    if (res.ok) {
      state.credit = /** @type {CreditPage} */ (await res.json());
      showLeaderboard(state.credit);
    }
  } catch {
    // the coordinator is away: the stream says so
  }
  setTimeout(pollCredit, CREDIT_POLL_MS);
}

// -- the stream -----------------------------------------------------------------------

async function stream() {
  /** @type {Record<string, string>} */
  const headers = {};
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  let res;
  try {
    res = await fetch(new URL("api/dashboard/stream", location.href), { headers, cache: "no-store" });
  } catch (err) {
    return retry(`coordinator unreachable (${err instanceof Error ? err.message : err})`);
  }
  if (res.status === 401 || res.status === 403) {
    $("auth").hidden = false;
    $("auth-error").textContent = t ? "token refused" : "";
    $("conn").textContent = "this coordinator needs its admin token";
    return;
  }
  if (!res.ok) return retry(`HTTP ${res.status}`);
  $("auth").hidden = true;
  state.connected = true;
  $("conn").textContent = "live";
  if (res.body === null) return retry("a response without a body");
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    /** @type {ReadableStreamReadResult<string>} */
    const { value, done } = await reader.read().catch(() => ({ done: true, value: undefined }));
    if (done) break;
    buf += value;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (data) onUpdate(JSON.parse(data));
    }
  }
  state.connected = false;
  if (state.status?.finished) {
    $("conn").textContent = "the job is finished; the coordinator closed the stream";
    return;
  }
  retry("stream ended");
}

/** @param {string} why */
function retry(why) {
  state.connected = false;
  $("conn").textContent = `${why}: retrying in 3 s`;
  // Reconnecting starts the series again from the beginning: clear ours first.
  for (const arr of [...Object.values(evals), ...Object.values(thru)]) arr.length = 0;
  setTimeout(stream, 3000);
}

$("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, element("token", HTMLInputElement).value);
  stream();
});
// Each chart takes its box's width (the box, not the chart, follows the layout).
for (const c of Object.values(charts)) {
  const box = c.root.parentElement;
  if (box) new ResizeObserver(() => c.setSize({ width: Math.max(200, box.clientWidth), height: 220 })).observe(box);
}
stream();
pollCredit();

// A module (bundled into a script by build.mjs): its names stay its own.
export {};
