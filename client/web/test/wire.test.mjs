import { test } from "node:test";
import assert from "node:assert/strict";
import { ExtData } from "@msgpack/msgpack";
import {
  decodeFrame, decodeRaw, encodeMessage, encodeRaw, toWire, NdArray, CLIENT_TYPES, SERVER_TYPES,
} from "../src/wire.js";
import { ErrorCode, ProtocolError, clientCloseCode, errorName, ERROR_CODES } from "../src/errors.js";
import { frameVectors, toJson, vectorBytes, vectorJson } from "./helpers.mjs";

const BIG = 1 << 24;

/** Keys the reference encoder leaves off at their default (§10 rule 3). */
const SPARSE = {
  hello: { data: false, init_schemes: [], boundary: false, volunteer: null, kernel: "" },
  welcome: { data: false, decline: false, job: "", volunteer: "" },
  task: { data: null, init_scheme: null, subnet: null, boundary: null },
  chunk: { blocks: 1 },
  bye: { detail: "" },
  heartbeat: { held: null },
};

function rejects(fn, code, text) {
  assert.throws(fn, (err) => {
    assert.ok(err instanceof ProtocolError, `expected ProtocolError, got ${err}`);
    assert.equal(errorName(err.code), code, err.message);
    if (text !== undefined) assert.ok(err.message.includes(text), `"${err.message}" lacks "${text}"`);
    return true;
  });
}

const valid = frameVectors().filter((n) => !("$error" in vectorJson(n)));
const invalid = frameVectors().filter((n) => "$error" in vectorJson(n));

test("the vectors are all there", () => {
  assert.ok(valid.length >= 36, `${valid.length} valid vectors`);
  assert.equal(invalid.length, 10);
  const types = new Set(valid.map((n) => vectorJson(n).type));
  for (const t of [...CLIENT_TYPES, ...SERVER_TYPES]) assert.ok(types.has(t), `no vector of type ${t}`);
});

for (const name of valid) {
  test(`vector ${name}: raw decode is its JSON, validated decode agrees`, () => {
    const json = vectorJson(name);
    const bytes = vectorBytes(name);
    assert.deepStrictEqual(toJson(decodeRaw(bytes, BIG)), json);
    const msg = toJson(decodeFrame(bytes, BIG));
    const sparse = SPARSE[json.type] ?? {};
    for (const [k, v] of Object.entries(msg)) {
      if (k in json) assert.deepStrictEqual(v, json[k], `${name}.${k}`);
      else assert.deepStrictEqual(v, sparse[k], `${name}.${k} is not in the vector and not a sparse default`);
    }
    for (const k of Object.keys(json)) assert.ok(k in msg, `${name}.${k} dropped`);
  });
}

for (const name of invalid) {
  test(`vector ${name}: rejected with its code`, () => {
    const { $error, $field } = vectorJson(name);
    rejects(() => decodeFrame(vectorBytes(name), BIG), $error, $field);
  });
}

// Integral floats (deadline 60.0, flops 0.0, limits) go out as ints from a
// JavaScript encoder (§1), so only these messages differ in their bytes (the
// exchanges' frames included: their names say the exchange, not the type).
const INEXACT_TYPES = new Set(["hello", "welcome", "task"]);

for (const name of valid) {
  test(`vector ${name}: re-encodes to the same message, keys in §10 order`, () => {
    const msg = decodeFrame(vectorBytes(name), BIG);
    const again = encodeMessage(msg);
    assert.deepStrictEqual(toJson(decodeFrame(again, BIG)), toJson(msg));
    assert.deepStrictEqual(Object.keys(decodeRaw(again)), Object.keys(vectorJson(name)));
    if (!INEXACT_TYPES.has(msg.type)) assert.deepStrictEqual(again, vectorBytes(name), "bytes differ from the vector");
  });
}

test("client vectors of every client type re-encode", () => {
  const seen = new Set(valid.map((n) => vectorJson(n).type).filter((t) => CLIENT_TYPES.includes(t)));
  assert.deepStrictEqual([...seen].sort(), [...CLIENT_TYPES].sort());
});

// -- framing ---------------------------------------------------------------------------

test("framing: too large, text, empty, trailing, not a map, non-str key, bad ext", () => {
  const bye = encodeMessage({ type: "bye", reason: "x" });
  rejects(() => decodeFrame(bye, bye.length - 1), "TOO_LARGE", "exceeds");
  assert.equal(decodeFrame(bye, bye.length).reason, "x");
  assert.equal(decodeFrame(bye.slice().buffer).type, "bye"); // an ArrayBuffer, as a websocket gives
  rejects(() => decodeFrame("{}"), "MALFORMED", "text frame");
  rejects(() => decodeFrame(new Uint8Array(0)), "MALFORMED", "msgpack");
  rejects(() => decodeFrame(Uint8Array.of(...bye, 0xc0)), "MALFORMED", "msgpack");
  rejects(() => decodeFrame(bye.subarray(0, bye.length - 1)), "MALFORMED", "msgpack");
  rejects(() => decodeFrame(encodeRaw(null)), "MALFORMED", "not a map");
  rejects(() => decodeFrame(encodeRaw("bye")), "MALFORMED", "not a map");
  rejects(() => decodeFrame(encodeRaw(new NdArray("uint8", [1], Uint8Array.of(1)))), "MALFORMED", "not a map");
  // {"type": "bye", 1: "x"}: an int key
  rejects(() => decodeFrame(Uint8Array.of(0x82, 0xa4, ...Buffer.from("type"), 0xa3, ...Buffer.from("bye"), 0x01, 0xa1, 0x78)),
    "MALFORMED");
  rejects(() => decodeFrame(encodeRaw({ type: "bye", x: new ExtData(5, Uint8Array.of(1, 2)) })), "MALFORMED", "ext type 5");
  rejects(() => decodeFrame(encodeRaw({ type: "bye", x: new Date(0) })), "MALFORMED", "ext type -1");
  rejects(() => decodeFrame(encodeRaw({ type: "bye", __proto__x: 1, ["__proto__"]: 1 })), "MALFORMED");
});

test("framing: every length is limited to the frame size", () => {
  // a map header announcing 2^32 - 1 entries in a 5-byte frame
  rejects(() => decodeFrame(Uint8Array.of(0xdf, 0xff, 0xff, 0xff, 0xff)), "MALFORMED");
  rejects(() => decodeFrame(Uint8Array.of(0x81, 0xa1, 0x78, 0xdd, 0xff, 0xff, 0xff, 0xff)), "MALFORMED");
  rejects(() => decodeFrame(Uint8Array.of(0x81, 0xa1, 0x78, 0xc6, 0x7f, 0xff, 0xff, 0xff)), "MALFORMED");
  rejects(() => decodeFrame(Uint8Array.of(0x81, 0xa1, 0x78, 0xdb, 0x7f, 0xff, 0xff, 0xff)), "MALFORMED");
  rejects(() => decodeFrame(Uint8Array.of(0x81, 0xa1, 0x78, 0xc9, 0x7f, 0xff, 0xff, 0xff, 0x01)), "MALFORMED");
});

test("type missing or unknown is UNKNOWN_TYPE", () => {
  rejects(() => decodeFrame(encodeRaw({ task_id: "t" })), "UNKNOWN_TYPE", "type");
  rejects(() => decodeFrame(encodeRaw({ type: 3 })), "UNKNOWN_TYPE", "type");
  rejects(() => decodeFrame(encodeRaw({ type: "toString" })), "UNKNOWN_TYPE", "toString");
});

// -- ndarrays (§4) ----------------------------------------------------------------------

function ext(head, shape, data = []) {
  const b = new Uint8Array(4 + 4 * shape.length + data.length);
  const v = new DataView(b.buffer);
  b.set(head, 0);
  shape.forEach((s, i) => v.setUint32(4 + 4 * i, s, true));
  b.set(data, 4 + 4 * shape.length);
  return encodeRaw({ type: "bye", x: new ExtData(1, b) });
}

test("ndarray: the §4 example, and every way to be wrong", () => {
  const frame = encodeRaw({ type: "bye", x: new ExtData(1, Uint8Array.of(2, 2, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 1, 2, 3)) });
  const a = decodeRaw(frame).x;
  assert.ok(a instanceof NdArray);
  assert.equal(a.dtype, "int8");
  assert.deepStrictEqual(a.shape, [1, 3]);
  assert.deepStrictEqual(Array.from(a.data), [1, 2, 3]);
  rejects(() => decodeFrame(ext([9, 1, 0, 0], [1], [0])), "BAD_FIELD", "dtype");
  rejects(() => decodeFrame(ext([3, 5, 0, 0], [1, 1, 1, 1, 1], [0])), "BAD_FIELD", "ndim");
  rejects(() => decodeFrame(ext([3, 1, 1, 0], [1], [0])), "BAD_FIELD", "reserved");
  rejects(() => decodeFrame(ext([3, 1, 0, 0], [2], [0])), "MALFORMED", "data bytes");
  rejects(() => decodeFrame(ext([0, 2, 0, 0], [1 << 14, 1 << 13])), "TOO_LARGE", "elements");
  rejects(() => decodeFrame(encodeRaw({ type: "bye", x: new ExtData(1, Uint8Array.of(0, 1)) })), "MALFORMED", "short");
  rejects(() => decodeFrame(encodeRaw({ type: "bye", x: new ExtData(1, Uint8Array.of(0, 2, 0, 0, 1, 0)) })), "MALFORMED", "shape");
});

test("ndarray: data at an odd offset is copied out aligned; float16 widens", () => {
  // a 1-char key before the ext puts the float32 data at an odd frame offset
  const data = new Uint8Array(new Float32Array([1.5, -2, 3.25]).buffer);
  const a = decodeRaw(ext([0, 1, 0, 0], [3], data)).x;
  assert.ok(a.data instanceof Float32Array);
  assert.deepStrictEqual(Array.from(a.data), [1.5, -2, 3.25]);
  const h = decodeRaw(ext([1, 2, 0, 0], [1, 2], [0x00, 0x3e, 0x00, 0xc0])).x; // 1.5, -2 as halves
  assert.equal(h.dtype, "float16");
  assert.ok(h.data instanceof Float32Array);
  assert.deepStrictEqual(Array.from(h.data), [1.5, -2]);
  // and back: encodeRaw packs an NdArray as ext 1
  assert.deepStrictEqual(toJson(decodeRaw(encodeRaw(h))), toJson(h));
});

// -- field checks ----------------------------------------------------------------------------

function taskWire(over = {}) {
  const t = decodeRaw(vectorBytes("task_train"));
  for (const [k, v] of Object.entries(over)) {
    if (v === undefined) delete t[k];
    else t[k] = v;
  }
  return encodeRaw(t);
}

test("the §7 example message, word for word", () => {
  rejects(() => decodeFrame(taskWire({ steps: 0 })), "BAD_FIELD");
  try {
    decodeFrame(taskWire({ steps: 0 }));
  } catch (err) {
    assert.equal(err.message, "task.steps: expected int in [1, 1000000000], got 0");
  }
});

test("defaults are filled in, unknown keys dropped", () => {
  const ack = decodeFrame(encodeRaw({ type: "ack", task_id: "t", accepted: true, future: [1, 2] }));
  assert.deepStrictEqual(ack, { type: "ack", task_id: "t", accepted: true, reason: "" });
  const t = decodeFrame(encodeRaw({
    type: "task", task_id: "t", model_version: 2, spec: { widths: [2, 3, 4] }, dataset: "d", base_version: 2,
  }));
  assert.deepStrictEqual(t.spec, { widths: [2, 3, 4], activations: ["relu", "identity"], loss: "softmax_ce", init: "he" });
  assert.equal(t.kind, "train");
  assert.equal(t.steps, 1);
  assert.equal(t.batch, 16);
  assert.deepStrictEqual(t.optimizer, {});
  assert.equal(t.deadline, 60);
  assert.equal(t.upload_codec, "fp32");
  assert.equal(t.temperature, 4);
  assert.equal(t.distill_alpha, 0.7);
  assert.equal(t.indices, null);
  assert.equal(t.data, null);
  const h = decodeFrame(encodeRaw({ type: "hello", client: "c" }));
  assert.deepStrictEqual(h.codecs, ["fp32"]);
  assert.deepStrictEqual(h.init_schemes, []);
  assert.equal(h.version, 1);
});

test("numbers: int where a float goes, no float where an int goes, no NaN", () => {
  assert.equal(decodeFrame(encodeRaw({ type: "heartbeat", seq: 1, time: 12 })).time, 12);
  rejects(() => decodeFrame(encodeRaw({ type: "heartbeat", seq: 1.5 })), "BAD_FIELD", "heartbeat.seq");
  rejects(() => decodeFrame(encodeRaw({ type: "heartbeat", seq: -1 })), "BAD_FIELD", "heartbeat.seq");
  rejects(() => decodeFrame(encodeRaw({ type: "heartbeat", seq: true })), "BAD_FIELD", "heartbeat.seq");
  rejects(() => decodeFrame(encodeRaw({ type: "heartbeat", seq: 1, time: NaN })), "BAD_FIELD", "heartbeat.time");
  rejects(() => decodeFrame(encodeRaw({ type: "heartbeat", seq: 1, time: 2e15 })), "BAD_FIELD", "heartbeat.time");
  assert.equal(decodeFrame(encodeRaw({ type: "heartbeat", seq: 1, echo: null })).echo, null);
  rejects(() => decodeFrame(encodeRaw({ type: "heartbeat", seq: 1, echo: "x" })), "BAD_FIELD", "heartbeat.echo");
  assert.equal(decodeFrame(encodeRaw({ type: "result", task_id: "t", model_version: 0, loss: Infinity })).loss, Infinity);
  rejects(() => decodeFrame(encodeRaw({ type: "result", task_id: "t", model_version: 0, loss: -Infinity })),
    "BAD_FIELD", "result.loss");
});

test("64-bit ranges: accepted exactly, as BigInt above 2^53 - 1", () => {
  const t = decodeFrame(taskWire({ seed: 2n ** 64n - 1n, model_version: 3n }));
  assert.equal(t.seed, 2n ** 64n - 1n);
  assert.equal(t.model_version, 3); // a small int64 is a Number
  assert.equal(decodeFrame(taskWire({ seed: 2 ** 53 - 1 })).seed, 2 ** 53 - 1);
  rejects(() => decodeFrame(taskWire({ model_version: 2n ** 63n })), "BAD_FIELD", "task.model_version");
  rejects(() => decodeFrame(taskWire({ seed: -1n })), "BAD_FIELD", "task.seed");
  rejects(() => decodeFrame(taskWire({ seed: 2 ** 60 + 0.5 })), "BAD_FIELD", "task.seed"); // float64
});

test("strings: lengths in code points, non-empty where required", () => {
  assert.equal(decodeFrame(encodeRaw({ type: "hello", client: "🙂".repeat(64) })).client.length, 128);
  rejects(() => decodeFrame(encodeRaw({ type: "hello", client: "🙂".repeat(65) })), "BAD_FIELD", "hello.client");
  rejects(() => decodeFrame(encodeRaw({ type: "hello", client: "" })), "BAD_FIELD", "hello.client");
  rejects(() => decodeFrame(encodeRaw({ type: "hello", client: "c", codecs: ["fp32", ""] })), "BAD_FIELD", "hello.codecs[1]");
  rejects(() => decodeFrame(encodeRaw({ type: "hello", client: "c", codecs: "fp32" })), "BAD_FIELD", "hello.codecs");
  rejects(() => decodeFrame(taskWire({ kind: "dream" })), "BAD_FIELD", "task.kind");
  rejects(() => decodeFrame(encodeRaw({ type: "fetch", data: "A".repeat(64) })), "BAD_FIELD", "fetch.data");
  rejects(() => decodeFrame(taskWire({ data: "0".repeat(63) })), "BAD_FIELD", "task.data");
});

test("limits map: required keys, nil rates, burst default", () => {
  const w = (limits) => encodeRaw({ type: "welcome", session_id: "s", limits });
  const ok = decodeFrame(w({ bytes_per_s: null, messages_per_s: 30, max_message_bytes: 2048 }));
  assert.deepStrictEqual(ok.limits, { bytes_per_s: null, messages_per_s: 30, max_message_bytes: 2048, burst: 1 });
  assert.equal(ok.heartbeat_interval, 5);
  rejects(() => decodeFrame(w({ bytes_per_s: null, messages_per_s: 30 })), "BAD_FIELD", "welcome.limits.max_message_bytes");
  rejects(() => decodeFrame(w({ bytes_per_s: 0, messages_per_s: 30, max_message_bytes: 2048 })), "BAD_FIELD", "welcome.limits.bytes_per_s");
  rejects(() => decodeFrame(w({ bytes_per_s: 1, messages_per_s: 1, max_message_bytes: 1000 })), "BAD_FIELD", "max_message_bytes");
  rejects(() => decodeFrame(w({ bytes_per_s: 1, messages_per_s: 1, max_message_bytes: 2048, burst: 0 })), "BAD_FIELD", "welcome.limits.burst");
  rejects(() => decodeFrame(encodeRaw({ type: "welcome", session_id: "s" })), "BAD_FIELD", "welcome.limits");
});

test("task rules of §3.3", () => {
  const t = (over) => () => decodeFrame(taskWire(over));
  rejects(t({ num_chunks: 8 }), "BAD_FIELD", "task.model_transfer");
  rejects(t({ model_transfer: "m", num_chunks: 0 }), "BAD_FIELD", "task.num_chunks");
  rejects(t({ base_version: null }), "BAD_FIELD", "task.num_chunks");
  assert.equal(decodeFrame(taskWire({ base_version: null, model_transfer: "m", num_chunks: 3 })).num_chunks, 3);
  rejects(t({ delta_base: 1 }), "BAD_FIELD", "task.delta_base"); // with base_version
  rejects(t({ base_version: null, model_transfer: "m", num_chunks: 3, delta_base: 3 }), "BAD_FIELD", "task.delta_base");
  assert.equal(decodeFrame(taskWire({ base_version: null, model_transfer: "m", num_chunks: 3, delta_base: 2 })).delta_base, 2);
  // version 0 from the seed
  const seeded = { model_version: 0, base_version: null, init_seed: 42, init_crc: 7 };
  assert.equal(decodeFrame(taskWire(seeded)).init_seed, 42);
  rejects(t({ ...seeded, model_version: 1 }), "BAD_FIELD", "task.init_seed");
  rejects(t({ ...seeded, init_crc: null }), "BAD_FIELD", "task.init_seed");
  rejects(t({ ...seeded, model_transfer: "m", num_chunks: 2 }), "BAD_FIELD", "task.init_seed");
  rejects(t({ ...seeded, base_version: 0 }), "BAD_FIELD", "task.init_seed");
  rejects(t({ init_crc: 7 }), "BAD_FIELD", "task.init_crc");
  rejects(t({ init_scheme: "x128ss-ih12" }), "BAD_FIELD", "task.init_scheme");
  rejects(t({ init_crc: 2 ** 32 }), "BAD_FIELD", "task.init_crc");
});

test("distill needs indices and teacher_logits of [len(indices), outputs]", () => {
  const d = decodeRaw(vectorBytes("task_distill"));
  const again = (over) => () => decodeFrame(encodeRaw({ ...d, ...over }));
  assert.equal(again({})().teacher_logits.dtype, "float16");
  rejects(again({ teacher_logits: null }), "BAD_FIELD", "task.teacher_logits");
  rejects(again({ indices: null }), "BAD_FIELD", "task.teacher_logits");
  rejects(again({ indices: new NdArray("uint32", [3], Uint32Array.of(1, 2, 3)) }), "BAD_FIELD", "task.teacher_logits");
  rejects(again({ teacher_logits: new NdArray("float32", [2, 2], new Float32Array(4)) }), "BAD_FIELD", "task.teacher_logits");
  rejects(again({ teacher_logits: new NdArray("float32", [2, 3], Float32Array.of(0, 0, 0, 0, 0, NaN)) }), "BAD_FIELD", "finite");
  rejects(again({ teacher_logits: new NdArray("int32", [2, 3], new Int32Array(6)) }), "BAD_FIELD", "task.teacher_logits");
  rejects(again({ indices: new NdArray("int32", [2], Int32Array.of(3, -1)) }), "BAD_FIELD", "task.indices");
  rejects(again({ indices: new NdArray("uint32", [1, 2], Uint32Array.of(3, 8)) }), "BAD_FIELD", "task.indices");
  rejects(again({ indices: new NdArray("uint8", [2], Uint8Array.of(3, 8)) }), "BAD_FIELD", "task.indices");
});

test("the spec map is closed and checked", () => {
  const spec = (s) => () => decodeFrame(taskWire({ spec: s }));
  rejects(spec({ widths: [2, 3], dropout: 0.5 }), "BAD_FIELD", "dropout");
  rejects(spec({ widths: [2] }), "BAD_FIELD", "task.spec.widths");
  rejects(spec({ widths: [2, 0] }), "BAD_FIELD", "task.spec.widths[1]");
  rejects(spec({ widths: [2, 2 ** 20 + 1] }), "BAD_FIELD", "task.spec.widths[1]");
  rejects(spec({ widths: [2, 3, 4], activations: ["relu"] }), "BAD_FIELD", "task.spec.activations");
  rejects(spec({ widths: [2, 3], activations: ["gelu"] }), "BAD_FIELD", "task.spec.activations[0]");
  rejects(spec({ widths: [2, 3], loss: "hinge" }), "BAD_FIELD", "task.spec.loss");
  rejects(spec({ widths: [2, 3], init: "zeros" }), "BAD_FIELD", "task.spec.init");
  rejects(spec([2, 3]), "BAD_FIELD", "task.spec");
  assert.deepStrictEqual(decodeFrame(taskWire({ spec: { widths: [2, 3], activations: [] } })).spec.activations, ["identity"]);
});

test("optimizer and metrics maps", () => {
  const o = decodeFrame(taskWire({ optimizer: { kind: "adam", lr: 1, nesterov: false } })).optimizer;
  assert.deepStrictEqual(o, { kind: "adam", lr: 1, nesterov: false });
  rejects(() => decodeFrame(taskWire({ optimizer: { lr: null } })), "BAD_FIELD", "task.optimizer.lr");
  rejects(() => decodeFrame(taskWire({ optimizer: { "": 1 } })), "BAD_FIELD", "task.optimizer key");
  const many = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, i]));
  rejects(() => decodeFrame(taskWire({ optimizer: many })), "BAD_FIELD", "task.optimizer");
  rejects(() => decodeFrame(encodeRaw({ type: "result", task_id: "t", model_version: 1, metrics: { a: "x" } })),
    "BAD_FIELD", "result.metrics.a");
});

test("chunk and data cross-field checks", () => {
  const c = decodeRaw(vectorBytes("chunk_tiny_w0"));
  rejects(() => decodeFrame(encodeRaw({ ...c, seq: c.total })), "BAD_FIELD", "chunk.seq");
  rejects(() => decodeFrame(encodeRaw({ ...c, row_end: c.row_start })), "BAD_FIELD", "chunk.row_end");
  assert.equal(decodeFrame(encodeRaw({ ...c, row_end: 1, row_start: 3, blocks: 2 })).blocks, 2); // spans wrap
  rejects(() => decodeFrame(encodeRaw({ ...c, blocks: 0 })), "BAD_FIELD", "chunk.blocks");
  rejects(() => decodeFrame(encodeRaw({ ...c, payload: "text" })), "BAD_FIELD", "chunk.payload");
  rejects(() => decodeFrame(encodeRaw({ ...c, codec: 256 })), "BAD_FIELD", "chunk.codec");
  const d = decodeRaw(vectorBytes("data"));
  rejects(() => decodeFrame(encodeRaw({ ...d, size: d.payload.length - 1 })), "BAD_FIELD", "data.payload");
  rejects(() => decodeFrame(encodeRaw({ ...d, size: 0 })), "BAD_FIELD", "data.size");
  assert.equal(decodeFrame(encodeRaw({ ...d, offset: 4, size: d.payload.length + 4 })).offset, 4);
});

// -- encoding ----------------------------------------------------------------------------

test("hello.volunteer and welcome.volunteer: sparse, last, checked (§3.1, §3.2)", () => {
  const raw = (m) => decodeRaw(encodeMessage(m));
  const key = "k".repeat(43);
  const h = raw({ type: "hello", client: "Ada", volunteer: key });
  assert.equal(h.volunteer, key);
  assert.equal(Object.keys(h).at(-1), "volunteer");
  assert.ok(!("volunteer" in raw({ type: "hello", client: "web/1", volunteer: null })), "nil: left off");
  assert.equal(decodeFrame(encodeRaw({ type: "hello", client: "c" })).volunteer, null);
  assert.equal(decodeFrame(encodeMessage({ type: "hello", client: "Ada", volunteer: key })).volunteer, key);
  rejects(() => decodeFrame(encodeRaw({ type: "hello", client: "c", volunteer: "k".repeat(129) })), "BAD_FIELD", "hello.volunteer");
  rejects(() => decodeFrame(encodeRaw({ type: "hello", client: "c", volunteer: 5 })), "BAD_FIELD", "hello.volunteer");
  const w = (extra) => encodeRaw({ type: "welcome", session_id: "s", limits: { bytes_per_s: null, messages_per_s: 30,
    max_message_bytes: 2048 }, ...extra });
  assert.equal(decodeFrame(w({})).volunteer, "");
  assert.equal(decodeFrame(w({ volunteer: "0123456789abcdef" })).volunteer, "0123456789abcdef");
  rejects(() => decodeFrame(w({ volunteer: "0123456789abcdef0" })), "BAD_FIELD", "welcome.volunteer");
});

test("encodeMessage: §3 key order, sparse keys only when set, defaults written", () => {
  const raw = (m) => decodeRaw(encodeMessage(m));
  assert.deepStrictEqual(Object.keys(raw({ type: "hello", client: "web/1" })), [
    "type", "version", "client", "platform", "cores", "memory", "flops", "limits", "codecs", "token", "resume",
    "deltas", "seeded_init", "spans",
  ]);
  const h = raw({ type: "hello", client: "web/1", data: true, init_schemes: ["x128ss-ih12"], spans: true });
  assert.equal(h.data, true);
  assert.deepStrictEqual(h.init_schemes, ["x128ss-ih12"]);
  assert.deepStrictEqual(Object.keys(raw({ type: "bye" })), ["type", "reason"]);
  assert.deepStrictEqual(raw({ type: "bye", reason: "finished", detail: "max_time" }), {
    type: "bye", reason: "finished", detail: "max_time",
  });
  assert.deepStrictEqual(raw({ type: "fetch", data: "a".repeat(64) }), { type: "fetch", data: "a".repeat(64), offset: 0 });
  // hello_minimal's bytes but for flops 0.0, which goes out as the int 0 (§1)
  const minimal = encodeMessage({ type: "hello", client: "vector-client/1" });
  const want = vectorBytes("hello_minimal");
  assert.equal(minimal.length, want.length - 8);
});

test("encodeMessage: ints above 2^32 stay ints, BigInts go out exactly", () => {
  const frame = encodeMessage({ type: "hello", client: "c", memory: 17179869184 });
  assert.ok(Buffer.from(frame).includes(Buffer.from([0xcf, 0, 0, 0, 4, 0, 0, 0, 0])), "memory as uint64");
  assert.equal(decodeFrame(frame).memory, 17179869184);
  const hb = encodeMessage({ type: "heartbeat", seq: 2n ** 60n, time: 1.5 });
  assert.equal(decodeFrame(hb).seq, 2n ** 60n);
  assert.equal(decodeFrame(encodeMessage({ type: "heartbeat", seq: 5n })).seq, 5);
  // a float field's large integral value goes out as float64, as the reference's
  const flops = encodeMessage({ type: "hello", client: "c", flops: 125000000000 });
  assert.ok(Buffer.from(flops).includes(Buffer.from([0xcb, 0x42, 0x3d, 0x1a, 0x94, 0xa2, 0x00, 0x00, 0x00])));
});

test("encodeMessage: a bad field is the caller's TypeError, not a ProtocolError", () => {
  assert.throws(() => encodeMessage({ type: "hello" }), TypeError);
  assert.throws(() => encodeMessage({ type: "hello", client: "c", cores: 0 }), /hello.cores/);
  assert.throws(() => encodeMessage({ type: "teleport" }), TypeError);
  assert.throws(() => encodeMessage({ type: "result", task_id: "t", model_version: 1, loss: NaN }), /result.loss/);
  assert.throws(() => encodeMessage({ type: "error", code: 3, message: "x".repeat(1025) }), /error.message/);
});

test("toWire fills defaults in table order", () => {
  assert.deepStrictEqual(toWire({ type: "decline", task_id: "t" }), { type: "decline", task_id: "t", reason: "" });
  assert.deepStrictEqual(Object.keys(toWire({ type: "result", task_id: "t", model_version: 1 })), [
    "type", "task_id", "model_version", "kind", "num_chunks", "loss", "samples", "steps", "compute_seconds", "metrics",
  ]);
});

// -- errors (§7) ---------------------------------------------------------------------------

test("error codes and client close codes", () => {
  assert.equal(ErrorCode.MALFORMED, 1);
  assert.equal(ErrorCode.SLOW_CONSUMER, 17);
  assert.equal(ERROR_CODES, ErrorCode);
  assert.equal(clientCloseCode(ErrorCode.MALFORMED), 4001);
  assert.equal(clientCloseCode(ErrorCode.TOO_LARGE), 4005);
  assert.equal(clientCloseCode(ErrorCode.INTERNAL), 4016);
  assert.equal(errorName(99), null);
  const e = new ProtocolError(ErrorCode.CHECKSUM, "chunk 3: crc32 mismatch");
  assert.ok(e instanceof Error);
  assert.equal(e.code, 10);
  assert.equal(e.codeName, "CHECKSUM");
  assert.equal(e.closeCode, 4010);
  assert.equal(e.message, "chunk 3: crc32 mismatch");
});

test("hello.kernel: a short token of a-z 0-9 . - (a family not known yet is valid)", () => {
  const hello = (kernel) => decodeFrame(encodeRaw({ type: "hello", client: "c", kernel }));
  assert.equal(hello("wasm-simd-f32").kernel, "wasm-simd-f32");
  assert.equal(hello("webgpu-f16").kernel, "webgpu-f16");
  for (const bad of ["JS", "js f64", "x".repeat(33), 7]) rejects(() => hello(bad), "BAD_FIELD", "hello.kernel");
});
