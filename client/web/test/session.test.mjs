// The browser session's rules (src/session.js) against server frames built
// here and decoded by the real decoder, as the worker would feed them.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Session, CODECS, CLIENT_NAME, taskRows } from "../src/session.js";
import { NdArray, decodeFrame, decodeRaw, encodeRaw } from "../src/wire.js";
import { KERNEL_FAMILY } from "../src/kernels.js";
import { Reassembler, encodeTransfer } from "../src/chunks.js";
import { initParams } from "../src/nn.js";
import { paramsLayout, normalizeSpec } from "../src/spec.js";
import { crc32 } from "../src/crc32.js";
import { parseCodec } from "../src/codecs.js";
import { dataCap } from "../src/pacer.js";

const SPEC = { widths: [4, 3, 2] };
const SHA = "ab".repeat(32);
const LAN = { bytes_per_s: 125e6, messages_per_s: 1e4, max_message_bytes: 1 << 20, burst: 1.0 };

/** A server frame as the worker sees it: encoded, then decoded and validated. */
const server = (msg) => decodeFrame(encodeRaw(msg), 1 << 26);
const sent = (actions) => actions.filter((a) => a.type === "send").map((a) => decodeFrame(a.frame));
const welcome = (extra = {}) =>
  server({ type: "welcome", session_id: "s1", resume_token: "r1", limits: LAN, heartbeat_interval: 5.0,
    spans: true, prefetch: true, data: true, decline: true, ...extra });

function seededTask(id, extra = {}) {
  const model = initParams(normalizeSpec(SPEC), 7);
  return server({
    type: "task", task_id: id, kind: "train", model_version: 0, spec: SPEC, dataset: "t#0",
    steps: 2, batch: 2, seed: 3, upload_codec: "fp32", init_seed: 7,
    init_crc: crc32(new Uint8Array(model.buffer)), init_scheme: "x128ss-ih12", data: SHA, ...extra,
  });
}

const shard = {
  n: 3, f: 4, t: 0, c: 2,
  X: Float32Array.from({ length: 12 }, (_, i) => i / 12), y: Int32Array.from([0, 1, 1]),
};

function ready() {
  const s = new Session({ token: "tok" });
  s.start(0);
  s.receive(welcome(), 0.01);
  return s;
}

test("hello announces what this client does", () => {
  const s = new Session({ token: "tok", flops: 3e9 });
  const [hello] = sent(s.start(0));
  assert.equal(hello.type, "hello");
  assert.equal(hello.token, "tok");
  assert.equal(hello.data, true);
  assert.equal(hello.spans, true);
  assert.equal(hello.deltas, true);
  assert.deepEqual(hello.init_schemes, ["x128ss-ih12"]);
  assert.deepEqual(hello.codecs, CODECS);
  for (const name of CODECS) parseCodec(name); // every codec announced is one we have
});

test("a volunteer's data cap goes out in hello.limits: half of it each way", () => {
  const [hello] = sent(new Session({ limits: dataCap(100) }).start(0));
  // the map protocol/limits.py's data_cap(100) makes: 100 MB an hour, both ways together
  assert.equal(hello.limits.bytes_per_s, 100e6 / 3600 / 2);
  assert.equal(hello.limits.messages_per_s, null); // the server's own message rate applies
  assert.equal(hello.limits.max_message_bytes, 256 * 1024 * 1024);
  assert.equal(hello.limits.burst, 1);
  assert.equal(sent(new Session().start(0))[0].limits, null); // no cap: the server's link
  for (const bad of [0, -1, NaN, Infinity, "100"]) {
    assert.throws(() => dataCap(/** @type {any} */ (bad)), /data cap/);
  }
});

test("with a volunteer key, hello sends it and the name; welcome's id is kept", () => {
  const key = "A".repeat(43);
  const s = new Session({ volunteer: key, name: "Ada", platform: "crowdgrad-web/0.1 (test)" });
  const [hello] = sent(s.start(0));
  assert.equal(hello.volunteer, key);
  assert.equal(hello.client, "Ada");
  assert.equal(hello.platform, "crowdgrad-web/0.1 (test)");
  assert.equal(s.volunteerId, null);
  s.receive(welcome({ volunteer: "0123456789abcdef" }), 0.01);
  assert.equal(s.volunteerId, "0123456789abcdef");
  // a new name goes out in the next hello (a reconnect), with the same key
  s.caps.name = "Ada L.";
  s.connectionLost(1);
  const [again] = sent(s.start(2));
  assert.deepEqual([again.client, again.volunteer], ["Ada L.", key]);
  s.receive(welcome(), 2.01); // a welcome that does not say it keeps the id
  assert.equal(s.volunteerId, "0123456789abcdef");
});

test("without a key, hello is anonymous and names the software", () => {
  const [hello] = sent(new Session({ name: "ignored" }).start(0));
  assert.equal(hello.volunteer, null);
  assert.equal(hello.client, CLIENT_NAME);
});

test("hello names the kernel family that computes (sparse: left off when unknown)", () => {
  for (const [name, family] of Object.entries(KERNEL_FAMILY)) {
    const [frame] = new Session({ kernel: family }).start(0);
    assert.equal(decodeFrame(frame.frame).kernel, family, name);
  }
  const [plain] = new Session({}).start(0);
  assert.ok(!("kernel" in decodeRaw(plain.frame)), "an unknown kernel is not on the wire");
  assert.deepEqual(Object.values(KERNEL_FAMILY).sort(), ["js-f64", "wasm-simd-f32"]);
});

test("a seeded task waits for its shard, then computes its rows", () => {
  const s = ready();
  const out = s.receive(seededTask("t1"), 0.02);
  assert.deepEqual(out.map((a) => a.type), ["shard"]);
  assert.equal(out[0].sha, SHA);
  const go = s.shardReady(SHA, shard, 0.03);
  const compute = go.find((a) => a.type === "compute");
  assert.ok(compute);
  assert.equal(compute.rows.n, 3);
  assert.equal(s.modelVersion, 0);
});

test("task.indices picks rows of the shard, in order", () => {
  const rows = taskRows({ indices: { data: Uint32Array.from([2, 0]) } }, shard);
  assert.equal(rows.n, 2);
  assert.deepEqual(Array.from(rows.y), [1, 0]);
  assert.deepEqual(Array.from(rows.X.subarray(0, 4)), Array.from(shard.X.subarray(8, 12)));
  assert.throws(() => taskRows({ indices: { data: Uint32Array.from([3]) } }, shard), /dataset/);
});

test("a wrong init CRC stops the client instead of training another model", () => {
  const s = ready();
  const out = s.receive(seededTask("t1", { init_crc: 12345 }), 0.02);
  assert.ok(out.some((a) => a.type === "finished" && /CRC-32/.test(a.reason)));
});

function computeFirst(s) {
  s.receive(seededTask("t1"), 0.02);
  const go = s.shardReady(SHA, shard, 0.03);
  return go.find((a) => a.type === "compute");
}

test("a result goes up as chunks; kept until its ack; resent after a reconnect", () => {
  const s = ready();
  const req = computeFirst(s);
  const update = new Float32Array(req.params.length).fill(0.5);
  const up = sent(s.computeDone(req.requestId, { update, loss: 0.7, samples: 4, steps: 2, metrics: {} }, 0.1));
  assert.equal(up[0].type, "result");
  assert.equal(up[0].task_id, "t1");
  assert.equal(up[0].num_chunks, up.length - 1);
  assert.ok(up.slice(1).every((c) => c.type === "chunk" && c.transfer === "t1"));
  assert.equal(s.unacked.size, 1);
  s.connectionLost(0.2);
  const [hello] = sent(s.start(1.0));
  assert.equal(hello.resume, "r1");
  const again = sent(s.receive(welcome({ resume_token: "r2" }), 1.1));
  assert.deepEqual(again.map((m) => m.type), up.map((m) => m.type), "the result is sent again");
  s.receive(server({ type: "ack", task_id: "t1", accepted: false, reason: "duplicate" }), 1.2);
  assert.equal(s.unacked.size, 0);
  assert.equal(s.stats.accepted, 1, "a duplicate is in the model once: counted as accepted");
});

test("a refused result is counted by its reason", () => {
  const s = ready();
  const req = computeFirst(s);
  s.computeDone(req.requestId, { update: new Float32Array(req.params.length), loss: 1, samples: 4, steps: 2 }, 0.1);
  s.receive(server({ type: "ack", task_id: "t1", accepted: false, reason: "norm" }), 0.2);
  assert.deepEqual(s.stats.refusals, { norm: 1 });
});

test("the answer to a prefetch queues behind the running task", () => {
  const s = ready();
  const req = computeFirst(s);
  const [pf] = sent(s.prefetch(0.05, req.requestId));
  assert.deepEqual(pf, { type: "prefetch", task_id: "t1" });
  const model = s.model;
  const t2 = server({ type: "task", task_id: "t2", model_version: 0, spec: SPEC, dataset: "t#0",
    steps: 1, batch: 2, base_version: 0, data: SHA });
  assert.deepEqual(s.receive(t2, 0.06).filter((a) => a.type === "compute"), [], "queued, not started");
  assert.equal(s.computing, req.requestId);
  const done = s.computeDone(req.requestId, { update: new Float32Array(model.length), loss: 1, samples: 4, steps: 2 }, 0.1);
  const next = done.find((a) => a.type === "compute");
  assert.equal(next.task.task_id, "t2", "the queued task starts the moment the first ends");
});

test("a delta download is added to the held model", () => {
  const s = ready();
  const req = computeFirst(s);
  const base = new Float32Array(s.model);
  s.computeDone(req.requestId, { update: new Float32Array(base.length), loss: 1, samples: 4, steps: 2 }, 0.1);
  const delta = new Float32Array(base.length).fill(0.25);
  const layout = paramsLayout(SPEC.widths);
  const chunks = encodeTransfer(delta, layout, { transfer: "m1", codec: "fp32", maxMessageBytes: 1 << 20 });
  s.receive(server({ type: "task", task_id: "t2", model_version: 3, spec: SPEC, dataset: "t#0",
    delta_base: 0, model_transfer: "m1", num_chunks: chunks.length, data: SHA }), 0.2);
  let out = [];
  for (const c of chunks) out = s.receive(server(c), 0.3);
  assert.ok(out.some((a) => a.type === "compute"));
  assert.equal(s.modelVersion, 3);
  for (let i = 0; i < base.length; i++) assert.equal(s.model[i], Math.fround(base[i] + 0.25));
});

test("a sub-model task trains its slice; the slice is never taken for the whole model", () => {
  const s = ready();
  const sub = { widths: [4, 2, 2] }; // neurons 0 and 2 of the job's 3
  const slice = new Float32Array(2 * 4 + 2 + 2 * 2 + 2).fill(0.5);
  const chunks = encodeTransfer(slice, paramsLayout(sub.widths), { transfer: "sub-1-3", codec: "fp32", maxMessageBytes: 1 << 20 });
  s.receive(server({ type: "task", task_id: "1", model_version: 3, spec: sub, dataset: "t#0",
    model_transfer: "sub-1-3", num_chunks: chunks.length, data: SHA,
    subnet: new NdArray("uint32", [2], Uint32Array.from([0, 2])) }), 0.1);
  for (const c of chunks) s.receive(server(c), 0.2);
  const req = s.shardReady(SHA, shard, 0.25).find((a) => a.type === "compute");
  assert.ok(req, "the slice trains like any model");
  assert.equal(req.task.spec.widths[1], 2);
  s.computeDone(req.requestId, { update: new Float32Array(slice.length), loss: 1, samples: 4, steps: 2 }, 0.3);
  // version 3 of the job's model (widths [4, 3, 2]) is not what it holds
  const next = sent(s.receive(server({ type: "task", task_id: "2", model_version: 3, spec: SPEC,
    dataset: "t#0", base_version: 3, data: SHA }), 0.4));
  assert.equal(next[0].type, "decline");
  assert.match(next[0].reason, /^model: base version 3 not held/);
});

test("a task this client cannot do is declined at once", () => {
  const s = ready();
  const out = sent(s.receive(server({ type: "task", task_id: "t9", model_version: 2, spec: SPEC,
    dataset: "t#0", base_version: 2, data: SHA }), 0.1));
  assert.equal(out[0].type, "decline");
  assert.match(out[0].reason, /^model: base version 2 not held/);
  const codec = sent(s.receive(seededTask("t10", { upload_codec: "zstd" }), 0.2));
  assert.match(codec[0].reason, /^codec: zstd/);
});

test("a refused model chunk declines the task, not the connection", () => {
  const s = ready();
  s.receive(server({ type: "task", task_id: "t3", model_version: 1, spec: SPEC, dataset: "t#0",
    model_transfer: "m3", num_chunks: 1, data: SHA }), 0.1);
  const layout = paramsLayout(SPEC.widths);
  const [chunk] = encodeTransfer(new Float32Array(23), layout, { transfer: "m3", codec: "fp32", maxMessageBytes: 1 << 20 });
  const out = sent(s.receive(server({ ...chunk, crc: (chunk.crc + 1) >>> 0 }), 0.2));
  assert.equal(out[0].type, "decline");
  assert.match(out[0].reason, /chunk refused/);
});

test("a finished bye ends the session; another bye does not", () => {
  const s = ready();
  assert.deepEqual(s.receive(server({ type: "bye", reason: "going away" }), 0.1).filter((a) => a.type === "finished"), []);
  const out = s.receive(server({ type: "bye", reason: "finished", detail: "target_accuracy" }), 0.2);
  assert.deepEqual(out.at(-1), { type: "finished", reason: "target_accuracy" });
  assert.equal(s.phase, "finished");
});

test("frames are paced to the granted message rate", () => {
  const s = new Session();
  s.start(0);
  s.receive(welcome({ limits: { ...LAN, messages_per_s: 1, burst: 1 } }), 0);
  const req = computeFirst(s);
  const out = sent(s.computeDone(req.requestId, { update: new Float32Array(req.params.length), loss: 1, samples: 4, steps: 2 }, 0.1));
  assert.ok(out.length < 2, "one message now at 1 message/s");
  const at = s.nextWakeup();
  assert.ok(at > 0.1);
  assert.ok(sent(s.tick(at)).length >= 1);
});

test("heartbeats when idle, echoing the server's clock", () => {
  const s = ready();
  s.receive(server({ type: "heartbeat", seq: 1, time: 42.5 }), 1);
  const [hb] = sent(s.tick(6));
  assert.equal(hb.type, "heartbeat");
  assert.equal(hb.echo, 42.5);
  assert.equal(hb.held, 5); // received at 1, echoed at 6: the server subtracts it
  s.connectionLost(7);
  s.start(8);
  s.receive(welcome(), 8);
  const [first] = sent(s.tick(13));
  assert.equal(first.echo, null, "a new connection echoes no old clock");
  assert.equal(first.held, null);
});

test("refusing a bad server frame closes with 4000 + code", () => {
  const s = ready();
  let err;
  try {
    decodeFrame(encodeRaw({ type: "task", task_id: "x" }), 1 << 20);
  } catch (e) {
    err = e;
  }
  const out = s.refuse(err, 0.5);
  assert.equal(out[1].type, "close");
  assert.equal(out[1].code, 4003);
  assert.equal(decodeFrame(out[0].frame).code, 3);
});

test("a layer-split lower task uploads its rows' boundary after the update (§3.3.2)", () => {
  const s = ready();
  s.receive(seededTask("t1", { boundary: 1 }), 0.02);
  const req = s.shardReady(SHA, shard, 0.03).find((a) => a.type === "compute");
  const update = new Float32Array(req.params.length).fill(0.25);
  const boundary = Float32Array.from({ length: 3 * 3 }, (_, i) => i);
  const up = sent(s.computeDone(req.requestId, { update, loss: 0.7, samples: 4, steps: 2, boundary }, 0.1));
  const layout = [
    ...paramsLayout(SPEC.widths),
    { layer: 2, part: "h", rows: 3, cols: 3, offset: req.params.length, size: 9 },
  ];
  const r = new Reassembler(layout, { transfer: "t1", total: up[0].num_chunks, expectCodec: null });
  for (const c of up.slice(1)) r.accept(c);
  assert.ok(r.complete);
  const flat = r.result();
  assert.deepEqual(Array.from(flat.subarray(req.params.length)), Array.from(boundary));
  assert.ok(flat.subarray(0, req.params.length).every((v) => v === 0.25));
});

test("a session keeps a bounded number of parsed shards, never its tasks' own", () => {
  const s = ready();
  computeFirst(s);
  for (let i = 0; i < 40; i++) s.shardReady(i.toString(16).padStart(64, "0"), shard, 0.05);
  assert.ok(s.shards.size <= 16);
  assert.ok(s.shards.has(SHA), "the running task's shard stays");
});

test("a lower task whose compute returned no boundary is declined, not sent half-made", () => {
  const s = ready();
  s.receive(seededTask("t1", { boundary: 1 }), 0.02);
  const req = s.shardReady(SHA, shard, 0.03).find((a) => a.type === "compute");
  const update = new Float32Array(req.params.length);
  const out = sent(s.computeDone(req.requestId, { update, loss: 0.7, samples: 4, steps: 2 }, 0.1));
  assert.deepEqual(out.map((m) => m.type), ["decline"]);
  assert.match(out[0].reason, /boundary/);
});

test("an update that is not finite is declined as diverged, never uploaded (§3.13)", () => {
  const s = ready();
  const req = computeFirst(s);
  const update = new Float32Array(req.params.length).fill(0.5);
  update[1] = NaN;
  const out = sent(s.computeDone(req.requestId, { update, loss: NaN, samples: 4, steps: 2 }, 0.1));
  assert.deepEqual(out.map((m) => m.type), ["decline"]);
  assert.equal(out[0].reason.split(":")[0], "diverged");
  assert.equal(s.stats.declined, 1);
  assert.equal(s.unacked.size, 0, "nothing is kept to resend");
});
