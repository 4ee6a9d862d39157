// The volunteer's Web Worker: the whole client runs here, never on the page's
// main thread (protocol, chunk reassembly, heartbeats, training), so a page or
// a game drawn beside it keeps its frame rate. It drives session.js with a
// socket, a clock and compute, as client/desktop.py drives client/session.py.
//
// Compute is sliced: a slice runs task steps for at most SLICE_MS × share, then
// the worker sleeps the rest of the slice, so the socket is read between slices
// (heartbeats, chunks, acks) and the CPU share is honoured. A hidden tab runs at
// a quarter of its share.
//
// Messages from the page: {cmd: "join", url, token, share, kernels, volunteer,
// name}, {cmd: "name", value}, {cmd: "share", value}, {cmd: "hidden", value}, {cmd: "pause", value},
// {cmd: "leave"}, {cmd: "predict", id, x}. To the page: {type: "stats", ...},
// {type: "log", ...}, {type: "prediction", ...}, {type: "finished", reason}.

import { decodeFrame } from "./wire.js";
import { ProtocolError } from "./errors.js";
import { Session, CLIENT_NAME } from "./session.js";
import { jsKernels, loadWasmKernels, KERNEL_FAMILY } from "./kernels.js";
import { startTask, predict } from "./nn.js";
import { parseShard, sha256Hex } from "./shard.js";
import { normalizeSpec } from "./spec.js";
import { dataCap } from "./pacer.js";

const SLICE_MS = 20;
const HIDDEN_FACTOR = 0.25;
const BACKOFF_S = [1, 2, 4, 8, 15, 30];
/** Frames before welcome (the server grants the real limit in it). */
const HELLO_MAX_BYTES = 64 << 20;
const SHARD_CACHE = "crowdgrad-shards-v1";
/** Shards kept in the page's Cache Storage at most, the oldest going first: a
 *  layer-split job sends a new one with every upper task (§3.3.2). */
const MAX_CACHED_SHARDS = 64;

/** @typedef {import("./kernels.js").Kernels} Kernels */
/** @typedef {import("./session.js").Action} Action */
/** @typedef {import("./nn.js").Rows} Rows */
/** @typedef {import("./wire.js").Task} Task */
/** @typedef {import("./pagemessages.js").ToWorker} ToWorker */
/** @typedef {import("./pagemessages.js").ToPage} ToPage */

const clock = () => performance.now() / 1000;

/** @param {ToPage} msg */
function tell(msg) {
  postMessage(msg);
}

class Volunteer {
  constructor() {
    /** @type {Session | null} */
    this.session = null;
    /** @type {WebSocket | null} */
    this.ws = null;
    this.url = "";
    /** @type {Kernels} */
    this.kernels = jsKernels;
    this.share = 1.0;
    this.hidden = false;
    this.paused = false;
    this.leaving = false;
    /** @type {string | null} */
    this.finished = null;
    this.attempt = 0;
    /** @type {number | undefined} */
    this.tickTimer = undefined;
    /** @type {number | undefined} */
    this.computeTimer = undefined;
    /** @type {number | undefined} */
    this.prefetchTimer = undefined;
    /** @type {{requestId: number, task: Task, runner: ReturnType<typeof startTask>, busy: number, perStep: number | null} | null} */
    this.run = null;
    /** @type {import("./spec.js").FullSpec | null} the spec of the model in session.model */
    this.spec = null;
    this.bytesIn = 0;
    this.steps = 0;
    this.busyS = 0;
    this.connects = 0;
    /** Connections lost and retried: a count, where `status` is only a moment. */
    this.drops = 0;
    this.status = "idle";
    this.lastError = "";
  }

  /** The session (join() makes it before anything else can run). */
  get #s() {
    if (this.session === null) throw new Error("worker: no session before join");
    return this.session;
  }

  /** @param {Extract<ToWorker, {cmd: "join"}>} msg */
  async join({ url, token, share, kernels, flops, volunteer, name, cap }) {
    this.url = url;
    this.share = clampShare(share);
    this.kernels = await chooseKernels(kernels);
    this.session = new Session({
      token: token || null,
      // The software first: hello.client is the volunteer's name (it has a key),
      // and the coordinator tells a tab from other clients by this (metrics.py).
      platform: `${CLIENT_NAME} (${navigator.userAgent})`.slice(0, 64),
      volunteer: volunteer || null,
      name,
      cores: 1,
      flops: flops ?? (this.kernels.name === "js" ? 2e8 : 2e9),
      // which §12 kernels compute its tasks: a replicating server pairs twins by it
      kernel: KERNEL_FAMILY[/** @type {keyof typeof KERNEL_FAMILY} */ (this.kernels.name)] ?? "",
      // the volunteer's data cap: the coordinator paces and sizes this tab's link by it
      limits: cap == null ? null : dataCap(cap),
    });
    this.connect();
    setInterval(() => this.report(), 500);
    this.report();
  }

  connect() {
    if (this.finished !== null || this.leaving) return;
    this.status = this.connects === 0 ? "connecting" : "reconnecting";
    this.connects += 1;
    const ws = new WebSocket(this.url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => this.apply(this.#s.start(clock()));
    ws.onmessage = (ev) => this.onFrame(ev.data);
    ws.onclose = (ev) => this.onClose(ws, ev);
    ws.onerror = () => {}; // onclose follows and says how
  }

  /** @param {unknown} data */
  onFrame(data) {
    if (this.ws === null || this.#s.phase === "finished") return;
    if (typeof data === "string") {
      this.refuse(new ProtocolError(1, "a text frame: every message is a binary frame (§2)"));
      return;
    }
    if (!(data instanceof ArrayBuffer)) return; // binaryType is "arraybuffer"
    const bytes = new Uint8Array(data);
    this.bytesIn += bytes.length;
    const limit = this.#s.limits?.maxMessageBytes ?? HELLO_MAX_BYTES;
    let msg;
    try {
      msg = decodeFrame(bytes, limit);
    } catch (err) {
      this.refuse(err);
      return;
    }
    if (msg.type === "welcome") {
      this.attempt = 0;
      this.status = "connected";
    }
    this.apply(this.#s.receive(msg, clock()));
  }

  /** @param {unknown} err */
  refuse(err) {
    this.log("warn", `server frame refused: ${err instanceof Error ? err.message : err}`);
    this.apply(this.#s.refuse(err, clock()));
  }

  /** @param {WebSocket} ws @param {CloseEvent} ev */
  onClose(ws, ev) {
    if (ws !== this.ws) return;
    this.ws = null;
    clearTimeout(this.tickTimer);
    clearTimeout(this.prefetchTimer);
    this.#s.connectionLost(clock());
    if (this.finished !== null) return;
    if (this.leaving) {
      this.status = "left";
      this.report();
      return;
    }
    // Refusals a retry cannot fix: a wrong token, a hello the job cannot serve.
    if (ev.code === 4007 || ev.code === 4003 || ev.code === 4004) {
      this.finish(`refused by the coordinator (close ${ev.code}: ${ev.reason || "no reason"})`, false);
      return;
    }
    // A newer connection resumed this session (§6): it goes on there, and
    // reconnecting with the same token would only take it back.
    if (ev.code === 4018) {
      this.finish(`session taken over by a newer connection (close ${ev.code})`, false);
      return;
    }
    const base = BACKOFF_S[Math.min(this.attempt, BACKOFF_S.length - 1)];
    this.attempt += 1;
    const delay = base * (0.5 + Math.random()); // jitter: tabs closed together do not return together
    this.drops += 1;
    this.status = `offline: retrying in ${delay.toFixed(1)} s (close ${ev.code})`;
    this.log("info", `connection lost (close ${ev.code}): retry ${this.attempt} in ${delay.toFixed(1)} s`);
    this.report();
    setTimeout(() => this.connect(), delay * 1000);
  }

  /** Carry out the session's actions.
   *  @param {Action[]} actions */
  apply(actions) {
    for (const a of actions) {
      switch (a.type) {
        case "send":
          if (this.ws !== null && this.ws.readyState === WebSocket.OPEN) this.ws.send(a.frame);
          break;
        case "close":
          if (this.ws !== null) this.ws.close(a.code, closeReason(a.reason));
          break;
        case "compute":
          this.startCompute(a);
          break;
        case "shard":
          this.fetchShard(a.sha);
          break;
        case "finished":
          this.finish(a.reason);
          break;
        case "log":
          this.log(a.level, a.text);
          break;
        default:
          break;
      }
    }
    this.scheduleTick();
  }

  scheduleTick() {
    clearTimeout(this.tickTimer);
    const at = this.session?.nextWakeup();
    if (at == null || this.ws === null) return;
    const ms = Math.max(0, (at - clock()) * 1000);
    this.tickTimer = setTimeout(() => this.apply(this.#s.tick(clock())), ms + 1);
  }

  // -- compute -----------------------------------------------------------------

  /** @param {Extract<Action, {type: "compute"}>} request */
  startCompute({ requestId, task, params, rows }) {
    clearTimeout(this.computeTimer);
    clearTimeout(this.prefetchTimer);
    this.dropRun();
    let runner;
    try {
      runner = startTask(task, params, rows, this.kernels);
    } catch (err) {
      this.apply(this.#s.computeFailed(requestId, `${reasonWord(err)}: ${messageOf(err)}`, clock()));
      return;
    }
    this.spec = normalizeSpec(task.spec);
    this.run = { requestId, task, runner, busy: 0, perStep: null };
    this.status = this.paused ? "paused" : "training";
    const delay = this.#s.prefetchDelay();
    if (delay !== null)
      this.prefetchTimer = setTimeout(
        () => this.apply(this.#s.prefetch(clock(), requestId)),
        (delay / this.effectiveShare()) * 1000,
      );
    this.computeTimer = setTimeout(() => this.slice(), 0);
  }

  /** Free a run's buffers (in wasm memory they are only given back in order). */
  dropRun() {
    this.run?.runner.close();
    this.run = null;
  }

  effectiveShare() {
    return this.share * (this.hidden ? HIDDEN_FACTOR : 1);
  }

  slice() {
    const run = this.run;
    if (run === null || run.requestId !== this.#s.computing) {
      if (run === this.run) this.dropRun(); // superseded by a newer task, or the job ended
      return;
    }
    if (this.paused) {
      this.computeTimer = setTimeout(() => this.slice(), 200);
      return;
    }
    const budget = SLICE_MS * this.effectiveShare();
    const t0 = performance.now();
    try {
      // Steps that fit the budget at the last measured speed (one at least).
      while (!run.runner.done) {
        const want = run.perStep ? Math.max(1, Math.floor((budget - (performance.now() - t0)) / run.perStep)) : 1;
        const s0 = performance.now();
        const took = run.runner.advance(want);
        const dt = performance.now() - s0;
        if (took > 0) run.perStep = dt / took;
        this.steps += took;
        if (performance.now() - t0 >= budget) break;
      }
    } catch (err) {
      this.dropRun();
      this.apply(this.#s.computeFailed(run.requestId, `${reasonWord(err)}: ${messageOf(err)}`, clock()));
      return;
    }
    const spent = performance.now() - t0;
    run.busy += spent;
    this.busyS += spent / 1000;
    if (run.runner.done) {
      this.run = null;
      const r = run.runner.result();
      this.status = "uploading";
      this.apply(this.#s.computeDone(run.requestId, { ...r, computeSeconds: run.busy / 1000 }, clock()));
      if (this.run === null && this.status === "uploading") this.status = "waiting for a task";
      return;
    }
    // Sleep the rest of the slice: spent/share in all, so the share holds.
    const rest = Math.max(0, spent / this.effectiveShare() - spent);
    if (rest < 1) soon(() => this.slice());
    else this.computeTimer = setTimeout(() => this.slice(), rest);
  }

  // -- shards by HTTP, kept in the Cache API (§13.3) ---------------------------

  /** @param {string} sha */
  async fetchShard(sha) {
    const url = shardUrl(this.url, sha);
    try {
      const bytes = await cachedShard(url, sha);
      const shard = parseShard(bytes);
      this.apply(this.#s.shardReady(sha, shard, clock()));
    } catch (err) {
      this.log("warn", `shard ${sha.slice(0, 12)}: ${messageOf(err)}`);
      this.apply(this.#s.shardFailed(sha, messageOf(err), clock()));
    }
  }

  // -- the page ------------------------------------------------------------------

  /** @param {ToWorker} msg */
  onPage(msg) {
    switch (msg.cmd) {
      case "join":
        this.join(msg).catch((err) => this.log("error", `join: ${messageOf(err)}`));
        break;
      case "name":
        if (this.session !== null) this.session.caps.name = msg.value; // said in the next hello
        break;
      case "share":
        this.share = clampShare(msg.value);
        break;
      case "hidden":
        this.hidden = !!msg.value;
        break;
      case "pause":
        this.paused = !!msg.value;
        this.status = this.paused ? "paused" : "training";
        break;
      case "leave":
        this.leaveNow();
        break;
      case "predict":
        this.predict(msg);
        break;
      default:
        break;
    }
    this.report();
  }

  leaveNow() {
    if (this.session === null || this.leaving) return;
    this.leaving = true;
    clearTimeout(this.computeTimer);
    this.dropRun();
    this.status = "left";
    this.apply(this.#s.leave(clock()));
  }

  /** @param {Extract<ToWorker, {cmd: "predict"}>} msg */
  predict({ id, x }) {
    const s = this.session;
    if (s === null || s.model === null || this.spec === null || x.length !== this.spec.widths[0]) {
      tell({ type: "prediction", id, outputs: null, version: null });
      return;
    }
    const out = predict(this.spec, s.model, Float32Array.from(x), 1, this.kernels);
    tell({ type: "prediction", id, outputs: Array.from(out), version: s.modelVersion });
  }

  /** Stop for good; `jobDone`: the job is over (else this tab stopped, e.g. refused). */
  /** @param {string} reason */
  finish(reason, jobDone = true) {
    if (this.finished !== null) return;
    this.finished = reason;
    this.status = "finished";
    clearTimeout(this.computeTimer);
    clearTimeout(this.tickTimer);
    this.dropRun();
    if (this.ws !== null && this.ws.readyState <= WebSocket.OPEN) this.ws.close(1000, "finished");
    tell({ type: "finished", reason, jobDone });
    this.report();
  }

  /** @param {"info" | "warn" | "error"} level @param {string} text */
  log(level, text) {
    tell({ type: "log", level, text });
  }

  report() {
    const s = this.session;
    if (s === null) return;
    tell({
      type: "stats",
      status: this.status,
      phase: s.phase,
      kernels: this.kernels.name,
      share: this.share,
      hidden: this.hidden,
      paused: this.paused,
      tasks: s.stats.tasks,
      accepted: s.stats.accepted,
      refused: s.stats.refused,
      declined: s.stats.declined,
      refusals: s.stats.refusals,
      unacked: s.unacked.size,
      computing: s.computing !== null,
      bytesIn: this.bytesIn,
      bytesOut: s.stats.bytesOut,
      modelVersion: s.modelVersion,
      steps: this.steps,
      busySeconds: this.busyS,
      connects: this.connects,
      drops: this.drops,
      rtt: s.rtt,
      finished: this.finished,
      widths: this.spec?.widths ?? null,
      volunteer: s.volunteerId,
      linkBytesPerS: s.limits === null || s.limits.bytesPerS === Infinity ? null : s.limits.bytesPerS,
    });
  }
}

// setTimeout(0) is clamped to 4 ms once nested; a message to ourselves is not,
// so at share 1.0 the worker loses no time between slices, yet still reads its
// socket (the websocket's events queue between these messages).
const channel = new MessageChannel();
/** @type {(() => void)[]} */
const soonQueue = [];
channel.port1.onmessage = () => soonQueue.shift()?.();
/** @param {() => void} fn */
function soon(fn) {
  soonQueue.push(fn);
  channel.port2.postMessage(0);
}

/** A close reason fits 123 UTF-8 bytes, or WebSocket.close throws. */
/** @param {string} text */
function closeReason(text) {
  let s = String(text);
  while (new TextEncoder().encode(s).length > 123) s = s.slice(0, -1);
  return s;
}

/** @param {unknown} v */
function clampShare(v) {
  const x = Number(v);
  return Number.isFinite(x) ? Math.min(1, Math.max(0.05, x)) : 1;
}

/** @param {unknown} err */
function reasonWord(err) {
  if (err instanceof RangeError && /memory|allocation/i.test(err.message)) return "memory";
  if (/^optimizer:/.test(messageOf(err))) return "optimizer";
  return "compute";
}

/** An error's message (or the thrown value, for a throw of something else).
 *  @param {unknown} err */
function messageOf(err) {
  return err instanceof Error ? err.message : String(err);
}

/** @param {string} which @returns {Promise<Kernels>} */
async function chooseKernels(which) {
  if (which === "js") return jsKernels;
  try {
    const res = await fetch(new URL("kernels.wasm", self.location.href));
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    return await loadWasmKernels(res);
  } catch (err) {
    // No SIMD in this browser, or the file is missing: the plain-JS kernels
    // compute the same numbers (the conformance vectors pass in both).
    tell({ type: "log", level: "info", text: `WebAssembly SIMD unavailable (${messageOf(err)}): plain JS` });
    return jsKernels;
  }
}

/** ws://host:port/ws → http://host:port/data/<sha>, beside the websocket path
 *  (§13.3; /crowd/ws → /crowd/data/<sha> for a coordinator mounted at /crowd).
 *  @param {string} wsUrl @param {string} sha */
export function shardUrl(wsUrl, sha) {
  const u = new URL(wsUrl);
  u.protocol = u.protocol === "wss:" ? "https:" : "http:";
  u.search = "";
  u.hash = "";
  return new URL(`data/${sha}`, u).href;
}

/** @param {string} url @param {string} sha */
async function cachedShard(url, sha) {
  const cache = globalThis.caches ? await globalThis.caches.open(SHARD_CACHE).catch(() => null) : null;
  if (cache !== null) {
    const hit = await cache.match(url);
    if (hit) {
      const bytes = new Uint8Array(await hit.arrayBuffer());
      if ((await sha256Hex(bytes)) === sha) return bytes;
      await cache.delete(url); // changed under us: fetch it again
    }
  }
  const res = await fetch(url);
  if (!res.ok) throw new Error(`HTTP ${res.status} for ${url}`);
  const bytes = new Uint8Array(await res.arrayBuffer());
  if ((await sha256Hex(bytes)) !== sha) throw new Error("its bytes do not match its hash");
  if (cache !== null) {
    await cache.put(url, new Response(bytes, { headers: { "Content-Type": "application/octet-stream" } }));
    const keys = await cache.keys(); // in the order they were put
    for (const old of keys.slice(0, Math.max(0, keys.length - MAX_CACHED_SHARDS))) await cache.delete(old);
  }
  return bytes;
}

if (typeof WorkerGlobalScope !== "undefined" && self instanceof WorkerGlobalScope) {
  const volunteer = new Volunteer();
  self.onmessage = (/** @type {MessageEvent<ToWorker>} */ ev) => volunteer.onPage(ev.data);
  // Our own bugs reach the page (and the tests) instead of vanishing.
  self.addEventListener("error", (e) => volunteer.log("error", `worker: ${e.message}`));
  self.addEventListener("unhandledrejection", (e) =>
    volunteer.log("error", `worker: ${e.reason?.stack ?? e.reason}`),
  );
}
