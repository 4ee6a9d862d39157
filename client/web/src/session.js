// The browser client's session: the sans-IO protocol state of docs/protocol.md
// §6, a port of client/session.py. It owns no socket, no clock and no compute:
// the worker (worker.js) feeds it decoded messages and the time, and carries
// out the actions it returns. So the rules below are tested in node without a
// browser (test/session.test.mjs) and the worker stays a thin driver.
//
// Rules (as the Python session):
// - A new task supersedes the running one, except the answer to our prefetch,
//   which queues behind it and starts the moment it ends (§3.12).
// - A finished result is kept until its ack; after a reconnect (hello.resume)
//   it is sent again; the server applies it at most once. The next task never
//   waits for an ack (§6).
// - The model of the last task is kept with its version: `base_version` needs
//   no download, `delta_base` downloads only the difference (§3.3).
// - A task naming a shard (task.data) computes once the shard is here: the
//   session asks the driver for it (`shard` action: HTTP + Cache API in the
//   browser) and the driver answers shardReady / shardFailed.
// - A task this client cannot do is declined (§3.13) where the server takes it.
// - Only a bye with reason `finished` ends the session; any other bye or close
//   lets the driver reconnect with backoff.
// - Every close for an error uses 4000 + code (§7).

import { ProtocolError, clientCloseCode, ERROR_CODES } from "./errors.js";
import { encodeMessage } from "./wire.js";
import { Reassembler, encodeTransfer } from "./chunks.js";
import { parseCodec, Residuals } from "./codecs.js";
import { crc32 } from "./crc32.js";
import { Generator } from "./rng.js";
import { initParams } from "./nn.js";
import { paramCount, paramsLayout, normalizeSpec } from "./spec.js";
import { linkLimits, Pacer } from "./pacer.js";

/** @typedef {import("./wire.js").Message} Message */
/** @typedef {import("./wire.js").Task} Task */
/** @typedef {import("./wire.js").Welcome} Welcome */
/** @typedef {import("./wire.js").Chunk} Chunk */
/** @typedef {import("./wire.js").OutMessage} OutMessage */
/** @typedef {import("./shard.js").Shard} Shard */
/** @typedef {import("./nn.js").Rows} Rows */
/** @typedef {import("./nn.js").TaskResult} TaskResult */
/** @typedef {import("./pacer.js").LinkLimits} LinkLimits */
/** @typedef {import("./pacer.js").WireLimits} WireLimits */

/** What the session asks its driver to do (worker.js carries them out).
 *  @typedef {{type: "send", frame: Uint8Array, message: OutMessage}
 *    | {type: "close", code: number, reason: string}
 *    | {type: "compute", requestId: number, task: Task, params: Float32Array, rows: Rows}
 *    | {type: "shard", sha: string}
 *    | {type: "finished", reason: string}
 *    | {type: "log", level: "info" | "warn" | "error", text: string}} Action */
/** A finished compute as the driver reports it: the task's result, the boundary
 *  activations when the task asks for them, and the seconds it computed.
 *  @typedef {Omit<TaskResult, "loss"> & {loss?: number | null, computeSeconds?: number}} ComputeResult */
/** @typedef {"new" | "hello_sent" | "ready" | "offline" | "finished"} Phase */
/** What the client says of itself in hello (everything optional). `volunteer`:
 *  the volunteer's key (hello.volunteer, credit is kept under it; volunteer.js
 *  makes and keeps it), and then `name` is hello.client, the name shown beside
 *  the credit; without a key the client is CLIENT_NAME (anonymous, no credit).
 *  `kernel`: the §12 kernel family it computes with (hello.kernel, kernels.js
 *  KERNEL_FAMILY; "" or absent: not sent, unknown to the server).
 *  @typedef {{flops?: number, cores?: number, memory?: number, platform?: string, limits?: WireLimits | null,
 *    token?: string | null, prefetch?: boolean, volunteer?: string | null, name?: string,
 *    kernel?: string}} Caps */

export const CLIENT_NAME = "crowdgrad-web/0.1";
export const INIT_SCHEME = "x128ss-ih12";
/** Results kept for resending while their acks are outstanding. */
export const MAX_UNACKED = 16;
/** Parsed shards a session keeps (those its tasks name are always kept). */
const MAX_HELD_SHARDS = 16;
/** The task seed's generator stream for stochastic rounding (§12.1). */
const ROUNDING_STREAM = 1;

/** Every codec name this client encodes and decodes (a parameterised name
 *  stands for its whole wire id). */
export const CODECS = [
  "fp32", "fp16", "int8", "int4", "int8-chunk", "int4-chunk", "int2",
  "topk:0.01", "topk:0.01+int8",
  "int8-sr", "int4-sr", "int8-chunk-sr", "int4-chunk-sr", "int2-sr", "topk:0.01+int8-sr",
];

/** @type {Record<Phase, Phase[]>} */
const PHASES = {
  new: ["hello_sent"],
  hello_sent: ["ready", "offline", "finished"],
  ready: ["offline", "finished"],
  offline: ["hello_sent"],
  finished: [],
};

/** A task's rows of its shard (§13): `indices` picks rows, nil means all. */
/** @param {{indices: {data: ArrayLike<number>} | null}} task @param {Shard} shard @returns {Rows} */
export function taskRows(task, shard) {
  const { f, t } = shard;
  const width = Math.max(1, t);
  const idx = task.indices?.data;
  if (!idx) return { X: shard.X, y: shard.y, n: shard.n, f, t };
  const n = idx.length;
  const X = new Float32Array(n * f);
  const y = t === 0 ? new Int32Array(n) : new Float32Array(n * t);
  for (let r = 0; r < n; r++) {
    const i = idx[r];
    if (i >= shard.n) throw new Error(`dataset: task.indices names row ${i} of a ${shard.n}-row shard`);
    X.set(shard.X.subarray(i * f, (i + 1) * f), r * f);
    y.set(shard.y.subarray(i * width, (i + 1) * width), r * width);
  }
  return { X, y, n, f, t };
}

export class Session {
  /**
   * caps: {flops, cores, memory, platform, limits (wire map or null), token,
   *        prefetch (bool)}; everything optional.
   * @param {Caps} caps
   */
  constructor(caps = {}) {
    this.caps = { flops: 1e9, cores: 1, memory: 0, platform: "", limits: null, token: null,
      prefetch: true, volunteer: null, name: CLIENT_NAME, ...caps };
    /** @type {Phase} */
    this.phase = "new";
    /** @type {string | null} */
    this.resumeToken = null;
    /** @type {LinkLimits | null} */
    this.limits = null;
    /** @type {Pacer | null} */
    this.pacer = null;
    this.heartbeatInterval = 5.0;
    this.server = { spans: false, prefetch: false, decline: false, data: false };
    /** @type {Float32Array | null} the model, Params layout */
    this.model = null;
    /** @type {number | null} */
    this.modelVersion = null;
    /** @type {Task | null} */
    this.task = null;
    /** @type {Task | null} */
    this.nextTask = null;
    this.nextReady = false;
    /** @type {string | null} */
    this.prefetchFor = null;
    this.windingDown = false;
    this.requestId = 0;
    /** @type {number | null} */
    this.computing = null;
    /** @type {Map<string, OutMessage[]>} task_id -> the result's messages */
    this.unacked = new Map();
    /** @type {Map<string, Shard>} sha -> parsed shard */
    this.shards = new Map();
    /** @type {Set<string>} */
    this.shardsAsked = new Set();
    /** @type {Set<string>} task ids whose model is here, shard not */
    this.waitData = new Set();
    /** @type {{reassembler: Reassembler, task: Task, started: number} | null} */
    this.download = null;
    /** @type {Residuals | null} error feedback, per upload codec */
    this.residuals = null;
    /** @type {number | null} */
    this.rtt = null;
    /** @type {number | null} */
    this.lastDownloadS = null;
    /** @type {number | null} */
    this.lastComputeS = null;
    /** @type {{message: OutMessage, frame: Uint8Array}[]} */
    this.outbox = [];
    this.hbSeq = 0;
    /** @type {number | null} the last heartbeat time the server sent (echoed back) */
    this.peerTime = null;
    this.peerTimeAt = 0; // when it came, on this clock (held = now - peerTimeAt, §3.7)
    this.helloSent = -Infinity;
    this.lastSent = -Infinity;
    this.now = -Infinity;
    this.stats = { tasks: 0, accepted: 0, refused: 0, declined: 0, bytesIn: 0, bytesOut: 0,
      refusals: /** @type {Record<string, number>} */ ({}) };
    /** @type {import("./wire.js").Bye | null} */
    this.bye = null;
    /** @type {string | null} the public id of our key (welcome.volunteer), once said */
    this.volunteerId = null;
  }

  // -- driver API ---------------------------------------------------------------

  /** A connection is open: say hello (with the resume token after a reconnect). */
  /** @param {number} now @returns {Action[]} */
  start(now) {
    this.#advance(now);
    this.#move("hello_sent");
    this.outbox = [];
    this.pacer = null;
    const hello = {
      type: "hello",
      version: 1,
      client: this.caps.volunteer ? this.caps.name : CLIENT_NAME,
      platform: this.caps.platform.slice(0, 64),
      cores: this.caps.cores,
      memory: this.caps.memory,
      flops: this.caps.flops,
      limits: this.caps.limits,
      codecs: CODECS,
      token: this.caps.token || null,
      resume: this.resumeToken,
      deltas: true,
      seeded_init: false,
      spans: true,
      data: true,
      init_schemes: [INIT_SCHEME],
      boundary: true,
      volunteer: this.caps.volunteer || null,
      // sparse (§9): left off when "" (unknown), so such a hello is the bytes it was before
      kernel: this.caps.kernel ?? "",
    };
    this.lastSent = this.helloSent = now;
    return [this.#send(hello)];
  }

  /** A decoded, validated message from the server.
   *  @param {Message} msg @param {number} now @returns {Action[]} */
  receive(msg, now) {
    this.#advance(now);
    /** @type {Action[]} */
    const out = [];
    if (this.phase !== "hello_sent" && this.phase !== "ready")
      throw new Error(`receive: session is ${this.phase}, not connected`);
    switch (msg.type) {
      case "welcome":
        this.#onWelcome(msg);
        break;
      case "task":
        this.#onTask(msg, out);
        break;
      case "chunk":
        this.#onChunk(msg, out);
        break;
      case "ack":
        if (this.unacked.delete(msg.task_id)) {
          // `duplicate`: the result is in the model once (§3.6), as accepted.
          if (msg.accepted || msg.reason === "duplicate") this.stats.accepted += 1;
          else {
            this.stats.refused += 1;
            this.stats.refusals[msg.reason] = (this.stats.refusals[msg.reason] ?? 0) + 1;
          }
        }
        break;
      case "heartbeat":
        this.peerTime = msg.time;
        this.peerTimeAt = now;
        if (msg.echo != null) this.rtt = Math.max(0, now - msg.echo);
        break;
      case "bye":
        if (msg.reason === "finished") {
          this.#move("finished");
          this.bye = msg;
          this.computing = null;
          out.push({ type: "finished", reason: msg.detail || msg.reason });
          return out;
        }
        break; // this connection only: the close follows and the driver reconnects
      case "error":
        out.push({ type: "log", level: "warn", text: `server error ${msg.code}: ${msg.message}` });
        break;
      default:
        // A type a server sends only to a peer that asked (data: we fetch by HTTP).
        break;
    }
    this.#flush(now, out);
    return out;
  }

  /** The driver finished compute request `requestId`; a superseded one is ignored. */
  /** @param {number} requestId @param {ComputeResult} result @param {number} now @returns {Action[]} */
  computeDone(requestId, result, now) {
    this.#advance(now);
    /** @type {Action[]} */
    const out = [];
    if (requestId !== this.computing || this.task === null) return out;
    if (this.task.boundary != null && !(result.boundary instanceof Float32Array)) {
      return this.computeFailed(requestId, "compute: the task asks for its boundary", now);
    }
    if (this.task.kind !== "evaluate" && result.update != null && !result.update.every(Number.isFinite)) {
      // Training diverged (an lr too high for this model): no codec carries it and the
      // server would refuse it. The word lets the server lower its tasks' lr (§3.13).
      return this.computeFailed(requestId, "diverged: the update is not finite", now);
    }
    this.computing = null;
    this.lastComputeS = Math.max(0, result.computeSeconds ?? 0);
    const task = this.task;
    const spec = normalizeSpec(task.spec);
    /** @type {Chunk[]} */
    let chunks = [];
    if (task.kind !== "evaluate") {
      const codec = parseCodec(task.upload_codec);
      let residuals = null;
      if (task.error_feedback) {
        // One set per upload codec: encodeTransfer's useCodec starts afresh on a change.
        this.residuals ??= new Residuals(codec);
        residuals = this.residuals;
      }
      let flat = result.update, layout = paramsLayout(spec.widths);
      if (flat === null) throw new Error(`computeDone: a ${task.kind} result without its update`);
      if (this.limits === null) throw new Error("computeDone: no link limits before welcome");
      if (task.boundary != null && result.boundary !== undefined) {
        // §3.3.2: the update, then block (L, "h"): every row's boundary activations
        const h = result.boundary;
        const width = spec.widths[task.boundary];
        if (h.length % width !== 0) throw new Error(`boundary: ${h.length} values, not rows of ${width}`);
        const offset = flat.length;
        layout = [...layout, { layer: spec.widths.length - 1, part: "h", rows: h.length / width, cols: width, offset, size: h.length }];
        const joined = new Float32Array(offset + h.length);
        joined.set(flat);
        joined.set(h, offset);
        flat = joined;
      }
      chunks = encodeTransfer(flat, layout, {
        transfer: task.task_id,
        codec,
        frameBytes: this.limits.frameBytes,
        maxMessageBytes: this.limits.maxMessageBytes,
        spans: this.server.spans,
        residuals,
        rand: task.upload_codec.endsWith("-sr") ? new Generator(task.seed, ROUNDING_STREAM) : null,
      });
    }
    const loss = result.loss;
    const message = {
      type: "result",
      task_id: task.task_id,
      model_version: task.model_version,
      kind: task.kind,
      num_chunks: chunks.length,
      loss: loss == null || !Number.isFinite(loss) ? null : loss,
      samples: result.samples,
      steps: result.steps,
      compute_seconds: this.lastComputeS,
      metrics: result.metrics ?? {},
    };
    const sent = [message, ...chunks];
    this.unacked.set(task.task_id, sent);
    for (const oldest of this.unacked.keys()) {
      if (this.unacked.size <= MAX_UNACKED) break;
      this.unacked.delete(oldest);
    }
    this.stats.tasks += 1;
    if (this.phase === "ready") for (const m of sent) this.#queue(m);
    this.prefetchFor = null;
    if (this.windingDown) {
      this.nextTask = null;
      this.nextReady = false;
    }
    this.task = null;
    if (this.nextTask !== null) this.#promoteNext(out);
    if (this.phase === "ready") this.#flush(now, out);
    return out;
  }

  /** The compute of `requestId` raised: decline the task, go on with a queued one. */
  /** @param {number} requestId @param {string} reason @param {number} now @returns {Action[]} */
  computeFailed(requestId, reason, now) {
    this.#advance(now);
    /** @type {Action[]} */
    const out = [];
    if (requestId !== this.computing || this.task === null) return out;
    this.computing = null;
    this.#decline(this.task, reason, out);
    if (this.phase === "ready") this.#flush(now, out);
    return out;
  }

  /** The driver has the shard `sha` (hash checked, parsed): start what waited for it. */
  /** @param {string} sha @param {Shard} shard @param {number} now @returns {Action[]} */
  shardReady(sha, shard, now) {
    this.#advance(now);
    /** @type {Action[]} */
    const out = [];
    this.shardsAsked.delete(sha);
    this.shards.delete(sha);
    this.shards.set(sha, shard);
    // Bounded (a layer-split job names a new shard per upper task, §3.3.2): the
    // oldest go, except those the current and the queued task name.
    const keep = new Set([this.task?.data, this.nextTask?.data]);
    for (const old of this.shards.keys()) {
      if (this.shards.size <= MAX_HELD_SHARDS) break;
      if (!keep.has(old)) this.shards.delete(old);
    }
    for (const task of [this.task, this.nextTask])
      if (task !== null && task.data === sha && this.waitData.has(task.task_id))
        this.#modelReady(task, out);
    if (this.phase === "ready") this.#flush(now, out);
    return out;
  }

  /** The shard could not be had (HTTP error, wrong hash): decline its tasks. */
  /** @param {string} sha @param {string} reason @param {number} now @returns {Action[]} */
  shardFailed(sha, reason, now) {
    this.#advance(now);
    /** @type {Action[]} */
    const out = [];
    this.shardsAsked.delete(sha);
    for (const task of [this.task, this.nextTask])
      if (task !== null && task.data === sha) this.#decline(task, `dataset: ${reason}`, out);
    if (this.phase === "ready") this.#flush(now, out);
    return out;
  }

  /** A server frame was invalid: `error` naming it, then close with 4000 + code. */
  /** @param {unknown} err @param {number} now @returns {Action[]} */
  refuse(err, now) {
    this.#advance(now);
    const code = err instanceof ProtocolError ? err.code : ERROR_CODES.INTERNAL;
    const message = String(err instanceof Error ? err.message : err).slice(0, 1024);
    const frame = encodeMessage({ type: "error", code, message });
    return [
      { type: "send", frame, message: { type: "error" } },
      { type: "close", code: clientCloseCode(code), reason: message.slice(0, 100) },
    ];
  }

  /** Leaving (pagehide, the leave button): finish nothing more, say bye. */
  /** @param {number} now @returns {Action[]} */
  leave(now, reason = "client stopping") {
    this.#advance(now);
    this.windingDown = true;
    if (this.phase !== "ready") return [];
    const bye = { type: "bye", reason };
    const frame = encodeMessage(bye);
    return [{ type: "send", frame, message: bye }, { type: "close", code: 1000, reason: "bye" }];
  }

  /** Seconds into the current compute to send `prefetch` (null: do not): one
   *  download plus a round trip before the compute should end, as measured. */
  prefetchDelay() {
    if (!this.server.prefetch || this.windingDown || this.task === null) return null;
    let computeS = this.lastComputeS;
    if (computeS === null) {
      if (!(this.caps.flops > 0)) return null;
      const w = this.task.spec.widths;
      let flops = 0;
      for (let l = 0; l + 1 < w.length; l++) flops += 6 * w[l] * w[l + 1];
      computeS = (flops * this.task.steps * this.task.batch) / this.caps.flops;
    }
    return Math.max(0, computeS - (this.lastDownloadS ?? 0) - (this.rtt ?? 0));
  }

  /** Ask for the next task while this one computes (a no-op when not useful). */
  /** @param {number} now @param {number | null} requestId @returns {Action[]} */
  prefetch(now, requestId = null) {
    this.#advance(now);
    /** @type {Action[]} */
    const out = [];
    if (
      this.phase === "ready" && this.server.prefetch && !this.windingDown &&
      this.computing !== null && (requestId === null || requestId === this.computing) &&
      this.task !== null && this.nextTask === null && this.prefetchFor === null
    ) {
      this.prefetchFor = this.task.task_id;
      this.#queue({ type: "prefetch", task_id: this.task.task_id });
      this.#flush(now, out);
    }
    return out;
  }

  /** The socket died: keep the model, the running compute and unacked results. */
  /** @param {number} now @returns {Action[]} */
  connectionLost(now) {
    this.#advance(now);
    if (this.phase === "hello_sent" || this.phase === "ready") this.#move("offline");
    this.download = null;
    // The server ends every lease of a lost connection: a queued task is void.
    this.nextTask = null;
    this.nextReady = false;
    this.prefetchFor = null;
    this.outbox = [];
    this.peerTime = null; // the next server may run another clock (§3.7)
    return [];
  }

  /** Heartbeats and paced frames. */
  /** @param {number} now @returns {Action[]} */
  tick(now) {
    this.#advance(now);
    /** @type {Action[]} */
    const out = [];
    if (this.phase === "ready" && this.outbox.length === 0 &&
        now >= this.lastSent + this.heartbeatInterval) {
      this.hbSeq += 1;
      // echo and held let the server measure its RTT to this client (§3.7)
      const held = this.peerTime === null ? null : Math.max(0, now - this.peerTimeAt);
      this.#queue({ type: "heartbeat", seq: this.hbSeq, time: now, echo: this.peerTime, held });
    }
    this.#flush(now, out);
    return out;
  }

  /** When tick wants to run next (null: nothing to do until a message comes). */
  nextWakeup() {
    if (this.phase !== "ready") return null;
    if (this.outbox.length > 0 && this.pacer !== null)
      return this.pacer.nextSendTime(this.outbox[0].frame.length, this.now);
    return this.lastSent + this.heartbeatInterval;
  }

  // -- internals ----------------------------------------------------------------

  /** @param {Welcome} msg */
  #onWelcome(msg) {
    if (this.phase !== "hello_sent") return;
    this.#move("ready");
    this.resumeToken = msg.resume_token || this.resumeToken;
    this.limits = linkLimits(msg.limits);
    this.pacer = new Pacer(this.limits);
    this.heartbeatInterval = msg.heartbeat_interval;
    if (msg.volunteer) this.volunteerId = msg.volunteer;
    this.server = {
      spans: !!msg.spans,
      prefetch: !!msg.prefetch && this.caps.prefetch,
      decline: !!msg.decline,
      data: !!msg.data,
    };
    if (this.rtt === null) this.rtt = Math.max(0, this.now - this.helloSent);
    for (const messages of this.unacked.values()) for (const m of messages) this.#queue(m);
  }

  /** @param {Task} msg @param {Action[]} out */
  #onTask(msg, out) {
    if (this.computing !== null && this.task !== null && this.prefetchFor === this.task.task_id) {
      this.prefetchFor = null; // the answer to our prefetch: queued
      this.nextTask = msg;
      this.nextReady = false;
    } else {
      this.task = msg;
      this.nextTask = null;
      this.nextReady = false;
      this.computing = null;
      this.prefetchFor = null;
    }
    this.download = null;
    try {
      parseCodec(msg.upload_codec);
    } catch {
      this.#decline(msg, `codec: ${msg.upload_codec} unknown`, out);
      return;
    }
    if (msg.kind === "gradient" || msg.kind === "train" || msg.kind === "distill" ||
        msg.kind === "evaluate") {
      // every kind of §12 is computed here
    } else {
      this.#decline(msg, `kind: ${msg.kind}`, out);
      return;
    }
    if (msg.data == null) {
      // Rows named by a built-in dataset only the reference reproduces (§13).
      this.#decline(msg, `dataset: ${msg.dataset} is not a shard`, out);
      return;
    }
    if (msg.delta_base != null && !this.#holds(msg.delta_base, msg)) {
      this.#decline(msg, `model: delta base ${msg.delta_base} not held`, out);
      return;
    }
    this.#haveData(msg, out); // start the shard's transfer now, beside the model's
    const spec = normalizeSpec(msg.spec);
    if (msg.init_seed != null) {
      if (msg.init_scheme !== INIT_SCHEME) {
        this.#decline(msg, `model: init scheme ${msg.init_scheme ?? "legacy pcg64"} unknown`, out);
        return;
      }
      const model = initParams(spec, msg.init_seed);
      const crc = crc32(new Uint8Array(model.buffer, model.byteOffset, model.byteLength));
      if (crc !== msg.init_crc) {
        out.push({ type: "finished", reason: `version 0 from init_seed ${msg.init_seed} has CRC-32 ${crc}, the coordinator's is ${msg.init_crc}` });
        return;
      }
      this.model = model;
      this.modelVersion = 0;
      this.#modelReady(msg, out);
      return;
    }
    if (msg.base_version != null) {
      if (!this.#holds(msg.base_version, msg)) {
        this.#decline(msg, `model: base version ${msg.base_version} not held`, out);
        return;
      }
      this.#modelReady(msg, out);
      return;
    }
    // No seed, no base: the model comes as chunks (wire.js refuses a task
    // without model_transfer here).
    if (msg.model_transfer === null) throw new Error(`task ${msg.task_id}: no model_transfer`);
    this.download = {
      reassembler: new Reassembler(paramsLayout(spec.widths), {
        transfer: msg.model_transfer, total: msg.num_chunks, expectCodec: null,
      }),
      task: msg,
      started: this.now,
    };
  }

  /** @param {Chunk} msg @param {Action[]} out */
  #onChunk(msg, out) {
    const dl = this.download;
    if (dl === null || msg.transfer !== dl.task.model_transfer) return; // superseded
    try {
      dl.reassembler.accept(msg);
    } catch (err) {
      if (!(err instanceof ProtocolError)) throw err;
      this.#decline(dl.task, `model: chunk refused (${err.message})`, out);
      return;
    }
    if (!dl.reassembler.complete) return;
    this.download = null;
    this.lastDownloadS = this.now - dl.started;
    const task = dl.task;
    const got = dl.reassembler.result();
    if (task.delta_base != null) {
      if (this.model === null || this.model.length !== got.length) {
        this.#decline(task, `model: delta base ${task.delta_base} no longer held`, out);
        return;
      }
      // A new array: a running compute may still read the old model.
      const model = new Float32Array(this.model);
      for (let i = 0; i < model.length; i++) model[i] += got[i];
      if (!model.every(Number.isFinite)) {
        this.model = null;
        this.modelVersion = null;
        this.#decline(task, "model: the delta made it non-finite", out);
        return;
      }
      this.model = model;
    } else {
      this.model = got;
    }
    this.modelVersion = task.model_version;
    this.#modelReady(task, out);
  }

  /** @param {Task} task @param {Action[]} out */
  #modelReady(task, out) {
    if (!this.#haveData(task, out)) {
      this.waitData.add(task.task_id);
      return;
    }
    this.waitData.delete(task.task_id);
    if (task === this.nextTask) this.nextReady = true;
    else if (task === this.task && this.computing === null) this.#request(out);
  }

  /** @param {Task} task @param {Action[]} out */
  #haveData(task, out) {
    const sha = task.data;
    if (sha == null || this.shards.has(sha)) return true;
    if (!this.shardsAsked.has(sha)) {
      this.shardsAsked.add(sha);
      out.push({ type: "shard", sha });
    }
    return false;
  }

  /** @param {Action[]} out */
  #request(out) {
    const task = this.task;
    if (task === null || this.model === null) throw new Error("session: a compute request with no task or model");
    this.requestId += 1;
    this.computing = this.requestId;
    let rows;
    try {
      const shard = task.data === null ? undefined : this.shards.get(task.data);
      if (shard === undefined) throw new Error(`dataset: shard ${task.data} not here`);
      rows = taskRows(task, shard);
    } catch (err) {
      this.computing = null;
      this.#decline(task, err instanceof Error ? err.message : String(err), out);
      return;
    }
    out.push({ type: "compute", requestId: this.requestId, task, params: this.model, rows });
  }

  /** @param {Action[]} out */
  #promoteNext(out) {
    this.task = this.nextTask;
    const ready = this.nextReady;
    this.nextTask = null;
    this.nextReady = false;
    if (ready) this.#request(out);
  }

  /** Whether the model held is `version` in `msg.spec`'s shape: after a sub-model
   *  task (§3.3.1) it is a slice, never the job's whole model.
   *  @param {number} version @param {Task} msg */
  #holds(version, msg) {
    return this.model !== null && this.modelVersion === version
      && this.model.length === paramCount(normalizeSpec(msg.spec).widths);
  }

  /** @param {Task} task @param {string} reason @param {Action[]} out */
  #decline(task, reason, out) {
    this.stats.declined += 1;
    out.push({ type: "log", level: "warn", text: `task ${task.task_id} declined: ${reason}` });
    this.waitData.delete(task.task_id);
    if (this.download !== null && this.download.task === task) this.download = null;
    if (task === this.nextTask) {
      this.nextTask = null;
      this.nextReady = false;
    } else if (task === this.task) {
      this.task = null;
      this.computing = null;
      this.prefetchFor = null;
      if (this.nextTask !== null) this.#promoteNext(out);
    }
    if (this.server.decline && this.phase === "ready")
      this.#queue({ type: "decline", task_id: task.task_id, reason: reason.slice(0, 256) });
  }

  /** @param {OutMessage} message @returns {Action} */
  #send(message) {
    const frame = encodeMessage(message);
    this.stats.bytesOut += frame.length;
    return { type: "send", frame, message };
  }

  /** @param {OutMessage} message */
  #queue(message) {
    this.outbox.push({ message, frame: encodeMessage(message) });
  }

  /** @param {number} now @param {Action[]} out */
  #flush(now, out) {
    while (this.outbox.length > 0) {
      const item = this.outbox[0];
      if (this.pacer !== null && !this.pacer.tryConsume(item.frame.length, now)) return;
      this.outbox.shift();
      this.stats.bytesOut += item.frame.length;
      out.push({ type: "send", frame: item.frame, message: item.message });
      this.lastSent = now;
    }
  }

  /** @param {Phase} to */
  #move(to) {
    if (!PHASES[this.phase].includes(to))
      throw new Error(`client session: ${this.phase} -> ${to} not allowed`);
    this.phase = to;
  }

  /** @param {number} now */
  #advance(now) {
    if (now > this.now) this.now = now;
  }
}
