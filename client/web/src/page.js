// The volunteer page's main thread: controls, numbers, the crowd view and the
// drawing pad. It never trains: the worker (worker.js) does, so this thread
// only draws and stays within its frame budget.
//
// URL: `?autostart=1` joins without a click (kiosks, tests); `#token=…` or the
// field gives a join token; `?share=0.5` the CPU share; `?kernels=js` forces
// the plain-JS kernels (benchmarks).

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const hashParams = new URLSearchParams(location.hash.slice(1));

/** What tests and a curious volunteer can read: the worker's latest numbers. */
const state = { stats: null, crowd: null, logs: [], finished: null, joined: false };
globalThis.crowdgrad = state;

const worker = new Worker(new URL("worker.js", location.href));
worker.onmessage = (ev) => onWorker(ev.data);

/** The websocket beside the page: /ws, or /crowd/ws for a page mounted at /crowd/. */
function wsUrl() {
  const u = new URL("ws", location.href);
  u.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  return u.href;
}

function join() {
  if (state.joined) return;
  state.joined = true;
  const token = $("token").value || hashParams.get("token") || "";
  worker.postMessage({
    cmd: "join",
    url: params.get("ws") || wsUrl(),
    token,
    share: Number($("share").value),
    kernels: params.get("kernels") || "wasm",
  });
  $("join").disabled = true;
  $("token").disabled = true;
  $("pause").disabled = false;
  $("leave").disabled = false;
  setStatus("connecting…");
}

function setStatus(text, cls = "") {
  const el = $("status");
  el.textContent = text;
  el.className = `status ${cls}`;
}

function onWorker(msg) {
  switch (msg.type) {
    case "stats":
      state.stats = msg;
      showStats(msg);
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
      $("pause").disabled = true;
      $("leave").disabled = true;
      break;
    default:
      break;
  }
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} kB`;
  return `${(n / (1 << 20)).toFixed(2)} MB`;
}

// What lending this tab costs the visitor's link: both directions' bytes per
// hour since the first byte moved (shown after a minute: sooner it is noise).
const traffic = { since: null };

function perHour(total) {
  const now = performance.now();
  if (total > 0 && traffic.since === null) traffic.since = now;
  const hours = traffic.since === null ? 0 : (now - traffic.since) / 3.6e6;
  return hours < 1 / 60 ? "–" : `${bytes(Math.round(total / hours))} an hour`;
}

function showStats(s) {
  $("tasks").textContent = s.tasks;
  $("accepted").textContent = s.accepted;
  $("refused").textContent = `${s.refused} · ${s.declined}`;
  $("steps").textContent = s.steps.toLocaleString();
  $("bytes-in").textContent = bytes(s.bytesIn);
  $("bytes-out").textContent = bytes(s.bytesOut);
  $("per-hour").textContent = perHour(s.bytesIn + s.bytesOut);
  $("kernels").textContent = s.kernels === "wasm-simd" ? "WebAssembly SIMD" : "plain JavaScript";
  $("version").textContent = s.modelVersion ?? "–";
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
      const st = await res.json();
      state.crowd = st;
      $("job").textContent = `${st.job.name} (${st.job.widths.join("·")})`;
      $("crowd").textContent = st.clients;
      const acc = st.last_evaluation?.accuracy;
      $("accuracy").textContent = acc == null ? "not measured yet" : `${(100 * acc).toFixed(1)}%`;
      $("crowd-accepted").textContent = st.accepted_results.toLocaleString();
    }
  } catch {
    // the coordinator is away; the worker reconnects, the numbers wait
  }
  setTimeout(pollCrowd, 2000);
}

// -- the crowd view: one dot per volunteer, animated every frame -------------

const view = $("crowd-view");
const vctx = view.getContext("2d");
const frames = { last: null, times: [] };
state.frames = frames;

function drawCrowd(t) {
  if (frames.last !== null) {
    frames.times.push(t - frames.last);
    if (frames.times.length > 600) frames.times.shift();
  }
  frames.last = t;
  const n = Math.min(200, state.crowd?.clients ?? 1);
  const w = view.width;
  const h = view.height;
  vctx.clearRect(0, 0, w, h);
  for (let i = 0; i < n; i++) {
    const phase = t / 900 + i * 2.399;
    const x = ((i * 37) % (w - 16)) + 8 + 4 * Math.sin(phase);
    const y = h / 2 + (h / 3) * Math.sin(phase * 0.7 + i);
    vctx.fillStyle = i === 0 ? "#2f6fdb" : "#9bb3d9";
    vctx.beginPath();
    vctx.arc(x, y, i === 0 ? 5 : 3, 0, 2 * Math.PI);
    vctx.fill();
  }
  requestAnimationFrame(drawCrowd);
}
requestAnimationFrame(drawCrowd);

// -- the drawing pad: 160×160 strokes read as the digits job's 8×8 input -----

const pad = $("pad");
const pctx = pad.getContext("2d");
let drawing = false;
let predictId = 0;

function clearPad() {
  pctx.fillStyle = "#000";
  pctx.fillRect(0, 0, pad.width, pad.height);
  $("bars").replaceChildren();
  $("guess").textContent = "";
}

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
  worker.postMessage({ cmd: "predict", id: predictId, x: padFeatures() });
}

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
$("share").addEventListener("input", () => {
  const v = Number($("share").value);
  $("share-out").textContent = `${Math.round(v * 100)}%`;
  worker.postMessage({ cmd: "share", value: v });
});
$("pause").addEventListener("click", () => {
  worker.postMessage({ cmd: "pause", value: !state.stats?.paused });
});
$("leave").addEventListener("click", () => {
  worker.postMessage({ cmd: "leave" });
  $("pause").disabled = true;
  $("leave").disabled = true;
});
document.addEventListener("visibilitychange", () => {
  worker.postMessage({ cmd: "hidden", value: document.visibilityState === "hidden" });
});
// The page is going away: the worker says bye so its lease is reissued now.
addEventListener("pagehide", () => worker.postMessage({ cmd: "leave" }));

if (params.has("share")) {
  $("share").value = params.get("share");
  $("share-out").textContent = `${Math.round(Number(params.get("share")) * 100)}%`;
}
if (hashParams.has("token")) $("token").value = hashParams.get("token");
clearPad();
pollCrowd();
if (params.get("autostart") === "1") join();
