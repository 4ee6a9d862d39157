// The volunteer page's main thread: controls, numbers, the crowd's accuracy
// curve (uPlot, from /api/history) and the drawing pad. It never trains: the
// worker (worker.js) does, so this thread only draws and stays within its frame
// budget.
//
// URL: `?autostart=1` joins without a click (kiosks, tests); `#token=…` or the
// field gives a join token; `?share=0.5` the CPU share; `?kernels=js` forces
// the plain-JS kernels (benchmarks).

import uPlot from "uplot";
import { checkName, formatFlops, loadIdentity, saveName } from "./volunteer.js";

/** @typedef {import("./pagemessages.js").ToWorker} ToWorker */
/** @typedef {import("./pagemessages.js").ToPage} ToPage */
/** @typedef {import("./pagemessages.js").Stats} Stats */
/** /api/status, the part this page shows.
 *  @typedef {{clients: number, accepted_results: number, job: {name: string, widths: number[]},
 *    last_evaluation?: {accuracy?: number | null} | null}} Status */
/** /api/history's evaluations, the part this page draws.
 *  @typedef {{evaluations: {fields: string[], rows: number[][]}}} History */
/** /api/credit/{volunteer}: one volunteer's account (coordinator/http/creditroutes.py).
 *  @typedef {{rank: number, volunteer: string, name: string, flops: number, pending_flops: number,
 *    results: number, forfeited: number, excluded: boolean}} Account */

/** The element `#id` of index.html, of class `Type` (a missing one is our bug).
 *  @template {HTMLElement} T
 *  @param {string} id @param {new () => T} Type @returns {T} */
function element(id, Type) {
  const el = document.getElementById(id);
  if (!(el instanceof Type)) throw new Error(`page: #${id} is not a ${Type.name}`);
  return el;
}
/** @param {string} id */
const $ = (id) => element(id, HTMLElement);
/** @param {string} id */
const input = (id) => element(id, HTMLInputElement);
/** @param {string} id */
const button = (id) => element(id, HTMLButtonElement);
/** @param {string} id */
const select = (id) => element(id, HTMLSelectElement);
const params = new URLSearchParams(location.search);
const hashParams = new URLSearchParams(location.hash.slice(1));

/** The page's storage, or null where the browser refuses it (a sandboxed frame). */
function storage() {
  try {
    return globalThis.localStorage ?? null;
  } catch {
    return null;
  }
}
// The volunteer: a key kept in this origin's localStorage (every visit and tab
// of this coordinator earns under it) and a display name (volunteer.js).
const identity = loadIdentity(storage());

/** What tests and a curious volunteer can read: the worker's latest numbers. */
const state = {
  /** @type {Stats | null} */
  stats: null,
  /** @type {Status | null} */
  crowd: null,
  /** @type {ToPage[]} */
  logs: [],
  /** @type {string | null} */
  finished: null,
  joined: false,
  /** the crowd's curve: the run's evaluations (wall seconds, accuracy), as drawn */
  curve: { t: /** @type {number[]} */ ([]), accuracy: /** @type {number[]} */ ([]) },
  /** your contribution: the public id welcome.volunteer said, its account (null:
   *  none yet, 404) and how many volunteers have one, as last polled */
  credit: {
    /** @type {string | null} */
    volunteer: null,
    /** @type {Account | null} */
    account: null,
    /** @type {number | null} */
    total: null,
    polls: 0,
  },
  /** the display name this page sends (the key stays out of this object) */
  name: identity.name,
};
Object.assign(globalThis, { crowdgrad: state });

const worker = new Worker(new URL("worker.js", location.href));
worker.onmessage = (/** @type {MessageEvent<ToPage>} */ ev) => onWorker(ev.data);

/** @param {ToWorker} msg */
function tell(msg) {
  worker.postMessage(msg);
}

/** The websocket beside the page: /ws, or /crowd/ws for a page mounted at /crowd/. */
function wsUrl() {
  const u = new URL("ws", location.href);
  u.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  return u.href;
}

function join() {
  if (state.joined || !takeName()) return;
  state.joined = true;
  const token = input("token").value || hashParams.get("token") || "";
  tell({
    cmd: "join",
    url: params.get("ws") || wsUrl(),
    token,
    share: Number(input("share").value),
    kernels: params.get("kernels") || "wasm",
    volunteer: identity.key,
    name: state.name,
    cap: select("cap").value === "" ? null : Number(select("cap").value),
  });
  button("join").disabled = true;
  input("token").disabled = true;
  select("cap").disabled = true; // hello asks for it once: a new cap needs a new visit
  button("pause").disabled = false;
  button("leave").disabled = false;
  setStatus("connecting…");
}

/** The name in the field, checked as the coordinator will (protocol/volunteer.py):
 *  kept and used when it passes, else the field says why. True when it passes. */
function takeName() {
  const field = input("name");
  const name = field.value;
  const why = checkName(name);
  const note = $("name-note");
  field.setAttribute("aria-invalid", String(why !== null));
  if (why !== null) {
    note.textContent = `Your name needs ${why}.`;
    note.className = "note bad";
    return false;
  }
  if (name !== state.name) {
    saveName(storage(), name);
    state.name = name;
    tell({ cmd: "name", value: name });
    if (state.joined) {
      note.textContent = "Saved: the leaderboard shows it from this page's next connection.";
      note.className = "note";
      return true;
    }
  }
  note.textContent = "";
  note.className = "note";
  return true;
}

/** @param {string} text */
function setStatus(text, cls = "") {
  const el = $("status");
  el.textContent = text;
  el.className = `status ${cls}`;
}

/** @param {ToPage} msg */
function onWorker(msg) {
  switch (msg.type) {
    case "stats":
      state.stats = msg;
      showStats(msg);
      if (msg.volunteer !== null && msg.volunteer !== state.credit.volunteer) {
        state.credit.volunteer = msg.volunteer;
        pollCredit(); // at once: its own timer goes on every few seconds
      }
      break;
    case "log":
      state.logs.push(msg);
      if (state.logs.length > 200) state.logs.shift();
      if (msg.level !== "info") console.warn(`[crowdgrad] ${msg.text}`);
      break;
    case "prediction":
      showPrediction(msg);
      break;
    case "finished":
      state.finished = msg.reason;
      setStatus(
        msg.jobDone
          ? `The job is finished (${msg.reason}). Thank you for helping!`
          : `Stopped: ${msg.reason}.`,
        "finished",
      );
      button("pause").disabled = true;
      button("leave").disabled = true;
      break;
    default:
      break;
  }
}

/** @param {number} n */
function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} kB`;
  return `${(n / (1 << 20)).toFixed(2)} MB`;
}

// What lending this tab costs the visitor's link: both directions' bytes per
// hour since the first byte moved (shown after a minute: sooner it is noise).
const traffic = { since: /** @type {number | null} */ (null) };

/** @param {number} total */
function perHour(total) {
  const now = performance.now();
  if (total > 0 && traffic.since === null) traffic.since = now;
  const hours = traffic.since === null ? 0 : (now - traffic.since) / 3.6e6;
  return hours < 1 / 60 ? "–" : `${bytes(Math.round(total / hours))} an hour`;
}

/** @param {Stats} s */
function showStats(s) {
  $("tasks").textContent = String(s.tasks);
  $("accepted").textContent = String(s.accepted);
  $("refused").textContent = `${s.refused} · ${s.declined}`;
  $("steps").textContent = s.steps.toLocaleString();
  $("bytes-in").textContent = bytes(s.bytesIn);
  $("bytes-out").textContent = bytes(s.bytesOut);
  $("per-hour").textContent = perHour(s.bytesIn + s.bytesOut);
  $("link").textContent =
    s.linkBytesPerS === null
      ? (s.phase === "new" || s.phase === "hello_sent" ? "–" : "no limit")
      : `${bytes(Math.round(s.linkBytesPerS))}/s each way`;
  $("kernels").textContent = s.kernels === "wasm-simd" ? "WebAssembly SIMD" : "plain JavaScript";
  $("version").textContent = s.modelVersion === null ? "–" : String(s.modelVersion);
  if (s.finished === null) {
    const busy = s.hidden ? " (tab hidden: a quarter of the share)" : "";
    setStatus(`${s.status}${busy}`);
  }
  $("pause").textContent = s.paused ? "Resume" : "Pause";
}

async function pollCrowd() {
  try {
    const res = await fetch(new URL("api/status", location.href), { cache: "no-store" });
    if (res.ok) {
      /** @type {Status} */
      const st = await res.json();
      state.crowd = st;
      $("job").textContent = `${st.job.name} (${st.job.widths.join("·")})`;
      $("crowd").textContent = String(st.clients);
      const acc = st.last_evaluation?.accuracy;
      $("accuracy").textContent = acc == null ? "not measured yet" : `${(100 * acc).toFixed(1)}%`;
      $("crowd-accepted").textContent = st.accepted_results.toLocaleString();
    }
    await pollCurve();
  } catch {
    // the coordinator is away; the worker reconnects, the numbers wait
  }
  setTimeout(pollCrowd, 2000);
}

// -- your contribution: this volunteer's credit --------------------------------
// /api/credit/{id} (404 until the coordinator knows the key) and
// /api/credit?limit=1 for how many volunteers there are, every few seconds
// from the moment welcome.volunteer names the id.

const CREDIT_POLL_MS = 3000;
/** @type {number | undefined} */
let creditTimer;
let creditPolling = false;

async function pollCredit() {
  if (creditPolling) return; // the poll under way sets the next one
  creditPolling = true;
  clearTimeout(creditTimer);
  const id = state.credit.volunteer;
  if (id !== null) {
    try {
      const [one, page] = await Promise.all([
        fetch(new URL(`api/credit/${encodeURIComponent(id)}`, location.href), { cache: "no-store" }),
        fetch(new URL("api/credit?limit=1", location.href), { cache: "no-store" }),
      ]);
      if (one.ok) state.credit.account = /** @type {Account} */ (await one.json());
      else if (one.status === 404) state.credit.account = null;
      if (page.ok) state.credit.total = /** @type {{total: number}} */ (await page.json()).total;
      state.credit.polls += 1;
      showCredit();
    } catch {
      // the coordinator is away: the numbers wait
    }
  }
  creditPolling = false;
  creditTimer = setTimeout(pollCredit, CREDIT_POLL_MS);
}

function showCredit() {
  const { volunteer, account, total } = state.credit;
  $("credit-id").textContent = volunteer ?? "–";
  const pending = account?.pending_flops ?? 0;
  $("credit-pending").textContent = formatFlops(pending);
  $("credit-pending").hidden = $("credit-pending-label").hidden = !(pending > 0);
  let note = "";
  if (account === null || (account.flops === 0 && account.results === 0 && !account.excluded)) {
    $("credit-flops").textContent = "no credit yet";
    $("credit-results").textContent = "0";
    $("credit-rank").textContent = "–";
    note = "Credit counts once the coordinator accepts a result of yours.";
  } else if (account.excluded) {
    $("credit-flops").textContent = "none: excluded";
    $("credit-results").textContent = `0 · ${account.forfeited} forfeited`;
    $("credit-rank").textContent = "–";
    note = "A result of this browser's was found wrong: its credit is forfeited.";
  } else {
    $("credit-flops").textContent = formatFlops(account.flops);
    const lost = account.forfeited ? ` · ${account.forfeited} forfeited` : "";
    $("credit-results").textContent = `${account.results.toLocaleString()}${lost}`;
    $("credit-rank").textContent = total === null ? String(account.rank) : `${account.rank} of ${total}`;
  }
  if (pending > 0) note = `${note} Some of it waits for a check by another volunteer's copy.`.trim();
  if (!identity.kept) note = `${note} This browser does not keep your key: credit is for this visit only.`.trim();
  $("credit-note").textContent = note;
}

// -- the crowd's curve: the run's accuracy over time -------------------------
// The whole series once, then each poll only the points after the last one
// (`?since=`); kept as /api/history keeps it (runtime/history.py): past
// CURVE_POINTS, every other point of the older half goes.

const CURVE_POINTS = 4096;
const curveBox = $("crowd-curve");

/** @param {HTMLElement} el */
function curveWidth(el) {
  return Math.max(200, el.clientWidth);
}

const curve = new uPlot(
  {
    width: curveWidth(curveBox),
    height: 150,
    scales: { x: { time: true }, y: { range: [0, 1] } },
    series: [{}, { label: "accuracy", stroke: "#2f6fdb", width: 2, points: { show: false } }],
    axes: [{}, { size: 52, values: (_u, vals) => vals.map((v) => `${Math.round(100 * v)}%`) }],
    legend: { show: false },
    cursor: { show: false },
  },
  [[], []],
  curveBox,
);
new ResizeObserver(() => curve.setSize({ width: curveWidth(curveBox), height: 150 })).observe(curveBox);

async function pollCurve() {
  const c = state.curve;
  const url = new URL("api/history", location.href);
  if (c.t.length) url.searchParams.set("since", String(c.t[c.t.length - 1]));
  const res = await fetch(url, { cache: "no-store" });
  if (!res.ok) return;
  /** @type {History} */
  const h = await res.json();
  const f = h.evaluations.fields;
  const [ti, ai] = [f.indexOf("t"), f.indexOf("accuracy")];
  if (!h.evaluations.rows.length) return;
  for (const r of h.evaluations.rows) {
    c.t.push(r[ti]);
    c.accuracy.push(r[ai]);
  }
  if (c.t.length > CURVE_POINTS) {
    const half = c.t.length >> 1;
    for (const arr of [c.t, c.accuracy]) arr.splice(0, half, ...arr.slice(0, half).filter((_, i) => i % 2 === 0));
  }
  curve.setData([c.t, c.accuracy]);
}

// -- the drawing pad: 160×160 strokes read as the digits job's 8×8 input -----

/** The 2-D context of `canvas` (every browser the page supports has one).
 *  @param {HTMLCanvasElement} canvas */
function context2d(canvas) {
  const ctx = canvas.getContext("2d");
  if (ctx === null) throw new Error("page: no 2-D canvas context");
  return ctx;
}

const pad = element("pad", HTMLCanvasElement);
const pctx = context2d(pad);
let drawing = false;
let predictId = 0;

function clearPad() {
  pctx.fillStyle = "#000";
  pctx.fillRect(0, 0, pad.width, pad.height);
  $("bars").replaceChildren();
  $("guess").textContent = "";
}

/** @param {PointerEvent} ev */
function stroke(ev) {
  const r = pad.getBoundingClientRect();
  const x = ((ev.clientX - r.left) / r.width) * pad.width;
  const y = ((ev.clientY - r.top) / r.height) * pad.height;
  pctx.fillStyle = "#fff";
  pctx.beginPath();
  pctx.arc(x, y, 9, 0, 2 * Math.PI);
  pctx.fill();
}

/** 8×8 cell means in [0, 1], as the digits job's features (scikit-learn's
 *  0..16 scaled by 1/16). */
function padFeatures() {
  const img = pctx.getImageData(0, 0, pad.width, pad.height).data;
  const cell = pad.width / 8;
  const x = new Float32Array(64);
  for (let py = 0; py < pad.height; py++)
    for (let px = 0; px < pad.width; px++)
      x[Math.floor(py / cell) * 8 + Math.floor(px / cell)] += img[(py * pad.width + px) * 4] / 255;
  for (let i = 0; i < 64; i++) x[i] = Math.min(1, x[i] / (cell * cell));
  return x;
}

function askPrediction() {
  predictId += 1;
  tell({ cmd: "predict", id: predictId, x: padFeatures() });
}

/** @param {Extract<ToPage, {type: "prediction"}>} msg */
function showPrediction(msg) {
  if (msg.id !== predictId) return;
  const bars = $("bars");
  if (msg.outputs === null) {
    $("guess").textContent = "No model yet: it arrives with the first task.";
    return;
  }
  const out = msg.outputs;
  const m = Math.max(...out);
  const e = out.map((o) => Math.exp(o - m));
  const z = e.reduce((a, b) => a + b, 0);
  const p = e.map((v) => v / z);
  bars.replaceChildren(
    ...p.map((v, i) => {
      const li = document.createElement("li");
      const bar = document.createElement("span");
      bar.className = "bar";
      bar.style.width = `${Math.round(150 * v)}px`;
      li.append(`${i} `, bar, ` ${(100 * v).toFixed(0)}%`);
      return li;
    }),
  );
  const best = p.indexOf(Math.max(...p));
  $("guess").textContent = `Model version ${msg.version} reads a ${best}.`;
}

pad.addEventListener("pointerdown", (ev) => {
  drawing = true;
  pad.setPointerCapture(ev.pointerId);
  stroke(ev);
});
pad.addEventListener("pointermove", (ev) => drawing && stroke(ev));
pad.addEventListener("pointerup", () => {
  drawing = false;
  askPrediction();
});

// -- controls ----------------------------------------------------------------

$("join-panel").addEventListener("submit", (ev) => {
  ev.preventDefault();
  join();
});
$("clear").addEventListener("click", clearPad);
// Checked as it is typed: the note comes and goes then, not when the field loses
// focus (a click on Join would find the button moved under it).
input("name").addEventListener("input", () => takeName());
input("share").addEventListener("input", () => {
  const v = Number(input("share").value);
  $("share-out").textContent = `${Math.round(v * 100)}%`;
  tell({ cmd: "share", value: v });
});
button("pause").addEventListener("click", () => {
  tell({ cmd: "pause", value: !state.stats?.paused });
});
button("leave").addEventListener("click", () => {
  tell({ cmd: "leave" });
  button("pause").disabled = true;
  button("leave").disabled = true;
});
document.addEventListener("visibilitychange", () => {
  tell({ cmd: "hidden", value: document.visibilityState === "hidden" });
});
// The page is going away: the worker says bye so its lease is reissued now.
addEventListener("pagehide", () => tell({ cmd: "leave" }));

const share = params.get("share");
if (share !== null) {
  input("share").value = share;
  $("share-out").textContent = `${Math.round(Number(share) * 100)}%`;
}
// ?cap=MB: a data cap of this many megabytes an hour (a link can carry it).
const cap = params.get("cap");
if (cap !== null) {
  const mb = Number(cap);
  if (cap !== "" && Number.isFinite(mb) && mb > 0) {
    const field = select("cap");
    if (![...field.options].some((o) => o.value === String(mb))) {
      field.add(new Option(`${mb} MB an hour`, String(mb)));
    }
    field.value = String(mb);
  } else {
    setStatus(`the link's cap=${cap} is not megabytes an hour above 0: no cap set`, "bad");
  }
}
const token = hashParams.get("token");
if (token !== null) input("token").value = token;
input("name").value = identity.name;
if (!identity.kept) showCredit();
clearPad();
pollCrowd();
if (params.get("autostart") === "1") join();

// A module (bundled into a script by build.mjs): its names stay its own.
export {};
