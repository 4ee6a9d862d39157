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
  "fp32", "fp16", "int8", "int4", "int8-chunk", "int4-chunk",
  "topk:0.01", "topk:0.01+int8",
  "int8-sr", "int4-sr", "int8-chunk-sr", "int4-chunk-sr", "topk:0.01+int8-sr",
];

const PHASES = {
  new: ["hello_sent"],
  hello_sent: ["ready", "offline", "finished"],
  ready: ["offline", "finished"],
  offline: ["hello_sent"],
  finished: [],
};

/** A task's rows of its shard (§13): `indices` picks rows, nil means all. */
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
   */
  constructor(caps = {}) {
    this.caps = { flops: 1e9, cores: 1, memory: 0, platform: "", limits: null, token: null,
      prefetch: true, ...caps };
    this.phase = "new";
    this.resumeToken = null;
    this.limits = null;
    this.pacer = null;
    this.heartbeatInterval = 5.0;
    this.server = { spans: false, prefetch: false, decline: false, data: false };
    this.model = null; // Float32Array, Params layout
    this.modelVersion = null;
    this.task = null;
    this.nextTask = null;
    this.nextReady = false;
    this.prefetchFor = null;
    this.windingDown = false;
    this.requestId = 0;
    this.computing = null;
    this.unacked = new Map(); // task_id -> [messages]
    this.shards = new Map(); // sha -> parsed shard
    this.shardsAsked = new Set();
    this.waitData = new Set(); // task ids whose model is here, shard not
    this.download = null; // {reassembler, task, started}
    this.residuals = null; // error feedback, per upload codec
    this.rtt = null;
    this.lastDownloadS = null;
    this.lastComputeS = null;
    this.outbox = [];
    this.hbSeq = 0;
    this.peerTime = null; // the last heartbeat time the server sent (echoed back)
    this.peerTimeAt = 0; // when it came, on this clock (held = now - peerTimeAt, §3.7)
    this.helloSent = -Infinity;
    this.lastSent = -Infinity;
    this.now = -Infinity;
    this.stats = { tasks: 0, accepted: 0, refused: 0, declined: 0, bytesIn: 0, bytesOut: 0,
      refusals: {} };
    this.bye = null;
  }

  // -- driver API ---------------------------------------------------------------

  /** A connection is open: say hello (with the resume token after a reconnect). */
  start(now) {
    this._advance(now);
    this._move("hello_sent");
    this.outbox = [];
    this.pacer = null;
    const hello = {
      type: "hello",
      version: 1,
      client: CLIENT_NAME,
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
    };
    this.lastSent = this.helloSent = now;
    return [this._send(hello)];
  }

  /** A decoded, validated message from the server. */
  receive(msg, now) {
    this._advance(now);
    const out = [];
    if (this.phase !== "hello_sent" && this.phase !== "ready")
      throw new Error(`receive: session is ${this.phase}, not connected`);
    switch (msg.type) {
      case "welcome":
        this._onWelcome(msg);
        break;
      case "task":
        this._onTask(msg, out);
        break;
      case "chunk":
        this._onChunk(msg, out);
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
          this._move("finished");
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
    this._flush(now, out);
    return out;
  }

  /** The driver finished compute request `requestId`; a superseded one is ignored. */
  computeDone(requestId, result, now) {
    this._advance(now);
    const out = [];
    if (requestId !== this.computing || this.task === null) return out;
    if (this.task.boundary != null && !(result.boundary instanceof Float32Array)) {
      return this.computeFailed(requestId, "compute: the task asks for its boundary", now);
    }
    this.computing = null;
    this.lastComputeS = Math.max(0, result.computeSeconds ?? 0);
    const task = this.task;
    const spec = normalizeSpec(task.spec);
    let chunks = [];
    if (task.kind !== "evaluate") {
      const codec = parseCodec(task.upload_codec);
      let residuals = null;
      if (task.error_feedback) {
        if (this.residuals === null || this.residuals.codecName !== task.upload_codec) {
          this.residuals = new Residuals();
          this.residuals.codecName = task.upload_codec;
        }
        residuals = this.residuals;
      }
      let flat = result.update, layout = paramsLayout(spec.widths);
      if (task.boundary != null) {
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
    this.unacked.set(task.task_id, [message, ...chunks]);
    while (this.unacked.size > MAX_UNACKED) this.unacked.delete(this.unacked.keys().next().value);
    this.stats.tasks += 1;
    if (this.phase === "ready") for (const m of this.unacked.get(task.task_id)) this._queue(m);
    this.prefetchFor = null;
    if (this.windingDown) {
      this.nextTask = null;
      this.nextReady = false;
    }
    this.task = null;
    if (this.nextTask !== null) this._promoteNext(out);
    if (this.phase === "ready") this._flush(now, out);
    return out;
  }

  /** The compute of `requestId` raised: decline the task, go on with a queued one. */
  computeFailed(requestId, reason, now) {
    this._advance(now);
    const out = [];
    if (requestId !== this.computing || this.task === null) return out;
    this.computing = null;
    this._decline(this.task, reason, out);
    if (this.phase === "ready") this._flush(now, out);
    return out;
  }

  /** The driver has the shard `sha` (hash checked, parsed): start what waited for it. */
  shardReady(sha, shard, now) {
    this._advance(now);
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
        this._modelReady(task, out);
    if (this.phase === "ready") this._flush(now, out);
    return out;
  }

  /** The shard could not be had (HTTP error, wrong hash): decline its tasks. */
  shardFailed(sha, reason, now) {
    this._advance(now);
    const out = [];
    this.shardsAsked.delete(sha);
    for (const task of [this.task, this.nextTask])
      if (task !== null && task.data === sha) this._decline(task, `dataset: ${reason}`, out);
    if (this.phase === "ready") this._flush(now, out);
    return out;
  }

  /** A server frame was invalid: `error` naming it, then close with 4000 + code. */
  refuse(err, now) {
    this._advance(now);
    const code = err instanceof ProtocolError ? err.code : ERROR_CODES.INTERNAL;
    const message = String(err.message ?? err).slice(0, 1024);
    const frame = encodeMessage({ type: "error", code, message });
    return [
      { type: "send", frame, message: { type: "error" } },
      { type: "close", code: clientCloseCode(code), reason: message.slice(0, 100) },
    ];
  }

  /** Leaving (pagehide, the leave button): finish nothing more, say bye. */
  leave(now, reason = "client stopping") {
    this._advance(now);
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
  prefetch(now, requestId = null) {
    this._advance(now);
    const out = [];
    if (
      this.phase === "ready" && this.server.prefetch && !this.windingDown &&
      this.computing !== null && (requestId === null || requestId === this.computing) &&
      this.task !== null && this.nextTask === null && this.prefetchFor === null
    ) {
      this.prefetchFor = this.task.task_id;
      this._queue({ type: "prefetch", task_id: this.task.task_id });
      this._flush(now, out);
    }
    return out;
  }

  /** The socket died: keep the model, the running compute and unacked results. */
  connectionLost(now) {
    this._advance(now);
    if (this.phase === "hello_sent" || this.phase === "ready") this._move("offline");
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
  tick(now) {
    this._advance(now);
    const out = [];
    if (this.phase === "ready" && this.outbox.length === 0 &&
        now >= this.lastSent + this.heartbeatInterval) {
      this.hbSeq += 1;
      // echo and held let the server measure its RTT to this client (§3.7)
      const held = this.peerTime === null ? null : Math.max(0, now - this.peerTimeAt);
      this._queue({ type: "heartbeat", seq: this.hbSeq, time: now, echo: this.peerTime, held });
    }
    this._flush(now, out);
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

  _onWelcome(msg) {
    if (this.phase !== "hello_sent") return;
    this._move("ready");
    this.resumeToken = msg.resume_token || this.resumeToken;
    this.limits = linkLimits(msg.limits);
    this.pacer = new Pacer(this.limits);
    this.heartbeatInterval = msg.heartbeat_interval;
    this.server = {
      spans: !!msg.spans,
      prefetch: !!msg.prefetch && this.caps.prefetch,
      decline: !!msg.decline,
      data: !!msg.data,
    };
    if (this.rtt === null) this.rtt = Math.max(0, this.now - this.helloSent);
    for (const messages of this.unacked.values()) for (const m of messages) this._queue(m);
  }

  _onTask(msg, out) {
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
      this._decline(msg, `codec: ${msg.upload_codec} unknown`, out);
      return;
    }
    if (msg.kind === "gradient" || msg.kind === "train" || msg.kind === "distill" ||
        msg.kind === "evaluate") {
      // every kind of §12 is computed here
    } else {
      this._decline(msg, `kind: ${msg.kind}`, out);
      return;
    }
    if (msg.data == null) {
      // Rows named by a built-in dataset only the reference reproduces (§13).
      this._decline(msg, `dataset: ${msg.dataset} is not a shard`, out);
      return;
    }
    if (msg.delta_base != null && !this._holds(msg.delta_base, msg)) {
      this._decline(msg, `model: delta base ${msg.delta_base} not held`, out);
      return;
    }
    this._haveData(msg, out); // start the shard's transfer now, beside the model's
    const spec = normalizeSpec(msg.spec);
    if (msg.init_seed != null) {
      if (msg.init_scheme !== INIT_SCHEME) {
        this._decline(msg, `model: init scheme ${msg.init_scheme ?? "legacy pcg64"} unknown`, out);
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
      this._modelReady(msg, out);
      return;
    }
    if (msg.base_version != null) {
      if (!this._holds(msg.base_version, msg)) {
        this._decline(msg, `model: base version ${msg.base_version} not held`, out);
        return;
      }
      this._modelReady(msg, out);
      return;
    }
    this.download = {
      reassembler: new Reassembler(paramsLayout(spec.widths), {
        transfer: msg.model_transfer, total: msg.num_chunks, expectCodec: null,
      }),
      task: msg,
      started: this.now,
    };
  }

  _onChunk(msg, out) {
    const dl = this.download;
    if (dl === null || msg.transfer !== dl.task.model_transfer) return; // superseded
    try {
      dl.reassembler.accept(msg);
    } catch (err) {
      if (!(err instanceof ProtocolError)) throw err;
      this._decline(dl.task, `model: chunk refused (${err.message})`, out);
      return;
    }
    if (!dl.reassembler.complete) return;
    this.download = null;
    this.lastDownloadS = this.now - dl.started;
    const task = dl.task;
    const got = dl.reassembler.result();
    if (task.delta_base != null) {
      // A new array: a running compute may still read the old model.
      const model = new Float32Array(this.model);
      for (let i = 0; i < model.length; i++) model[i] += got[i];
      if (!model.every(Number.isFinite)) {
        this.model = null;
        this.modelVersion = null;
        this._decline(task, "model: the delta made it non-finite", out);
        return;
      }
      this.model = model;
    } else {
      this.model = got;
    }
    this.modelVersion = task.model_version;
    this._modelReady(task, out);
  }

  _modelReady(task, out) {
    if (!this._haveData(task, out)) {
      this.waitData.add(task.task_id);
      return;
    }
    this.waitData.delete(task.task_id);
    if (task === this.nextTask) this.nextReady = true;
    else if (task === this.task && this.computing === null) this._request(out);
  }

  _haveData(task, out) {
    const sha = task.data;
    if (sha == null || this.shards.has(sha)) return true;
    if (!this.shardsAsked.has(sha)) {
      this.shardsAsked.add(sha);
      out.push({ type: "shard", sha });
    }
    return false;
  }

  _request(out) {
    const task = this.task;
    this.requestId += 1;
    this.computing = this.requestId;
    let rows;
    try {
      rows = taskRows(task, this.shards.get(task.data));
    } catch (err) {
      this.computing = null;
      this._decline(task, err.message, out);
      return;
    }
    out.push({ type: "compute", requestId: this.requestId, task, params: this.model, rows });
  }

  _promoteNext(out) {
    this.task = this.nextTask;
    const ready = this.nextReady;
    this.nextTask = null;
    this.nextReady = false;
    if (ready) this._request(out);
  }

  /** Whether the model held is `version` in `msg.spec`'s shape: after a sub-model
   *  task (§3.3.1) it is a slice, never the job's whole model. */
  _holds(version, msg) {
    return this.model !== null && this.modelVersion === version
      && this.model.length === paramCount(normalizeSpec(msg.spec).widths);
  }

  _decline(task, reason, out) {
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
      if (this.nextTask !== null) this._promoteNext(out);
    }
    if (this.server.decline && this.phase === "ready")
      this._queue({ type: "decline", task_id: task.task_id, reason: reason.slice(0, 256) });
  }

  _send(message) {
    const frame = encodeMessage(message);
    this.stats.bytesOut += frame.length;
    return { type: "send", frame, message };
  }

  _queue(message) {
    this.outbox.push({ message, frame: encodeMessage(message) });
  }

  _flush(now, out) {
    while (this.outbox.length > 0) {
      const item = this.outbox[0];
      if (this.pacer !== null && !this.pacer.tryConsume(item.frame.length, now)) return;
      this.outbox.shift();
      this.stats.bytesOut += item.frame.length;
      out.push({ type: "send", frame: item.frame, message: item.message });
      this.lastSent = now;
    }
  }

  _move(to) {
    if (!PHASES[this.phase].includes(to))
      throw new Error(`client session: ${this.phase} -> ${to} not allowed`);
    this.phase = to;
  }

  _advance(now) {
    if (now > this.now) this.now = now;
  }
}
