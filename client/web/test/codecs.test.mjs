import { test } from "node:test";
import assert from "node:assert/strict";
import {
  CodecError, CodecId, Residuals, decodePiece, encodePiece, encodedSize, isKnownWireId, parseCodec, pieceSize,
  topIndices, topkCount,
} from "../src/codecs.js";
import { f16ToF32, f32ToF16 } from "../src/half.js";
import { fromHex, toHex } from "../src/bytes.js";
import { ProtocolError, errorName } from "../src/errors.js";
import { readFileSync } from "node:fs";
import { VECTORS, Xoshiro, computeJson, f32list } from "./helpers.mjs";

const VEC = computeJson("codecs");

function input(name) {
  const { shape, values } = VEC.inputs[name];
  return { x: Float32Array.from(values), rows: shape.length === 2 ? shape[0] : 1 };
}

function badChunk(fn, text) {
  assert.throws(fn, (err) => {
    assert.ok(err instanceof ProtocolError, `expected ProtocolError, got ${err}`);
    assert.equal(errorName(err.code), "BAD_CHUNK");
    if (text) assert.ok(err.message.includes(text), `"${err.message}" lacks "${text}"`);
    return true;
  });
}

test("the test generator is §12.1's (rng.json)", () => {
  // seeds above 2^53 must not go through a double: read them as text
  const text = readFileSync(new URL("compute/rng.json", VECTORS), "utf8").replace(/"seed": (\d+)/g, '"seed": "$1"');
  for (const c of JSON.parse(text).cases) {
    const g = new Xoshiro(BigInt(c.seed), c.stream);
    assert.deepStrictEqual(g.s, c.state);
    assert.deepStrictEqual(Array.from({ length: 12 }, () => g.nextU32()), c.next_u32);
  }
});

for (const e of VEC.encodings) {
  const sr = e.task_seed !== undefined;
  test(`codecs.json: ${e.codec} of ${e.input}${sr ? ` (seed ${e.task_seed})` : ""} to the bit`, () => {
    const { x, rows } = input(e.input);
    const c = parseCodec(e.codec);
    assert.equal(c.id, e.id);
    const rand = sr ? new Xoshiro(e.task_seed, e.stream) : undefined;
    const payload = encodePiece(e.codec, x, rows, { rand });
    assert.equal(toHex(payload), e.hex);
    assert.equal(payload.length, encodedSize(c, rows, x.length));
    assert.deepStrictEqual(f32list(decodePiece(e.id, fromHex(e.hex), rows, x.length)), e.decoded);
  });
}

test("rng.js's Generator drives stochastic rounding to the same bytes", async () => {
  const { Generator } = await import("../src/rng.js");
  for (const e of VEC.encodings.filter((v) => v.task_seed !== undefined)) {
    const { x, rows } = input(e.input);
    assert.equal(toHex(encodePiece(e.codec, x, rows, { rand: new Generator(e.task_seed, e.stream) })), e.hex);
  }
});

test("codecs.json: error feedback, two steps, residuals to the bit", () => {
  const fb = VEC.error_feedback;
  const res = new Residuals(fb.codec);
  const key = Residuals.key(0, "W", 0, fb.shape[0]);
  for (const step of fb.steps) {
    const payload = res.encode(key, Float32Array.from(step.input), fb.shape[0]);
    assert.equal(toHex(payload), step.hex);
    assert.deepStrictEqual(f32list(res.residual(key)), step.residual);
  }
  assert.equal(res.size, 1);
  res.reset(key);
  assert.equal(res.residual(key), null);
});

test("error feedback: fp32 keeps nothing, a new codec starts afresh, sizes must match", () => {
  const res = new Residuals("fp32");
  res.encode("k", Float32Array.of(1, 2), 1);
  assert.equal(res.size, 0);
  const r = new Residuals();
  assert.throws(() => r.encode("k", Float32Array.of(1), 1), TypeError);
  r.useCodec("int8");
  r.encode("k", Float32Array.of(1, 0.3), 1);
  assert.equal(r.size, 1);
  r.useCodec("int8");
  assert.equal(r.size, 1);
  r.useCodec("int4");
  assert.equal(r.size, 0);
  r.encode("k", Float32Array.of(1, 0.3), 1);
  assert.throws(() => r.encode("k", Float32Array.of(1, 0.3, 3), 1), CodecError);
});

test("error feedback: what is sent plus what is owed is what was meant", () => {
  const g = new Xoshiro(5, 0);
  const res = new Residuals("topk:0.1+int8");
  const sent = new Float64Array(64);
  const meant = new Float64Array(64);
  for (let round = 0; round < 5; round++) {
    const x = Float32Array.from({ length: 64 }, () => (g.nextU32() / 2 ** 32 - 0.5) * 2);
    x.forEach((v, i) => (meant[i] += v));
    const d = decodePiece(CodecId.TOPK_INT8, res.encode("k", x, 8), 8, 64);
    d.forEach((v, i) => (sent[i] += v));
  }
  const owed = res.residual("k");
  for (let i = 0; i < 64; i++) assert.ok(Math.abs(sent[i] + owed[i] - meant[i]) < 1e-5, `value ${i}`);
});

test("parseCodec: names, ids and refusals", () => {
  const ids = {
    fp32: 0, fp16: 1, int8: 2, int4: 3, "topk:0.01": 4, "topk:0.01+int8": 5, "int8-chunk": 6, "int4-chunk": 7,
    "int8-sr": 2, "int4-sr": 3, "int8-chunk-sr": 6, "int4-chunk-sr": 7, "topk:0.25+int8-sr": 5, "topk:1": 4,
    int2: 8, "int2-sr": 8,
    "topk:1e-3": 4, "topk:.5": 4,
  };
  for (const [name, id] of Object.entries(ids)) {
    const c = parseCodec(name);
    assert.equal(c.id, id, name);
    assert.equal(c.name, name);
    assert.equal(c.stochastic, name.endsWith("-sr"), name);
  }
  assert.equal(parseCodec("topk:1e-3").fraction, 0.001);
  assert.equal(parseCodec("fp32").lossless, true);
  assert.equal(parseCodec("int4-chunk").perRow, false);
  assert.equal(parseCodec("int4").levels, 7);
  assert.equal(parseCodec("int2-sr").levels, 1);
  for (const bad of ["", "fp64", "int16", "int2-chunk", "fp32-sr", "fp16-sr", "topk", "topk:", "topk:0", "topk:1.5", "topk:-0.1",
    "topk:0.1-sr", "topk:abc", "topk:1e", "INT8", " int8"]) {
    assert.throws(() => parseCodec(bad), CodecError, JSON.stringify(bad));
  }
  assert.throws(() => parseCodec(3), CodecError);
  assert.equal(isKnownWireId(8), true);
  assert.equal(isKnownWireId(9), false);
  assert.equal(isKnownWireId(-1), false);
});

test("top-k: k's formula forgives the binary error of a decimal", () => {
  assert.equal(topkCount(100, 0.07), 7); // 0.07·100 = 7.000000000000001
  assert.equal(topkCount(100, 0.071), 8);
  assert.equal(topkCount(10, 0.01), 1); // at least one
  assert.equal(topkCount(3, 1), 3);
  assert.equal(topkCount(0, 0.5), 0);
  assert.equal(topkCount(21, 0.25), 6);
  assert.equal(encodedSize("topk:0.07", 1, 100), 4 + 8 * 7);
  assert.equal(encodedSize("topk:0.07+int8", 1, 100), 8 + 5 * 7);
});

test("top-k: equal magnitudes go to the lower index; matches a sort on random ties", () => {
  assert.deepStrictEqual(Array.from(topIndices(Float32Array.of(1, -2, 2, -2, 0), 2)), [1, 2]);
  assert.deepStrictEqual(Array.from(topIndices(Float32Array.of(0, -0, 0, 0), 3)), [0, 1, 2]);
  const g = new Xoshiro(11, 0);
  for (let trial = 0; trial < 200; trial++) {
    const n = 1 + (g.nextU32() % 300);
    const levels = 1 + (g.nextU32() % 6); // few distinct magnitudes: many ties
    const x = Float32Array.from({ length: n }, () => ((g.nextU32() % (2 * levels + 1)) - levels) / 4);
    const k = 1 + (g.nextU32() % n);
    const want = Array.from(x.keys())
      .sort((a, b) => Math.abs(x[b]) - Math.abs(x[a]) || a - b)
      .slice(0, k)
      .sort((a, b) => a - b);
    assert.deepStrictEqual(Array.from(topIndices(x, k)), want, `n ${n} k ${k}`);
  }
});

test("fp16: round to nearest even over the whole range, subnormals included", () => {
  // the nearest half by search over the positive halves, ties to the even one
  const halves = Float64Array.from({ length: 0x7c00 }, (_, h) => f16ToF32(h));
  const nearest = (a) => {
    let lo = 0, hi = 0x7bff;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (halves[mid] <= a) lo = mid;
      else hi = mid - 1;
    }
    if (lo === 0x7bff) return a - halves[lo] >= 16 ? 0x7c00 : lo; // 65520 and up: inf
    const d0 = a - halves[lo], d1 = halves[lo + 1] - a;
    return d0 < d1 || (d0 === d1 && lo % 2 === 0) ? lo : lo + 1;
  };
  const g = new Xoshiro(3, 0);
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  for (let i = 0; i < 200000; i++) {
    u[0] = (g.nextU32() % 0x47800000) | (i & 1 ? 0x80000000 : 0); // |x| < 65536, both signs
    const x = f[0];
    const want = nearest(Math.abs(x)) | (x < 0 || Object.is(x, -0) ? 0x8000 : 0);
    assert.equal(f32ToF16(x), want, `x = ${x}`);
  }
  assert.equal(f32ToF16(2 ** -25), 0); // half the smallest subnormal: a tie, to the even 0
  assert.equal(f32ToF16(3 * 2 ** -25), 2); // 1.5 units: to the even 2
  assert.equal(f32ToF16(Infinity), 0x7c00);
  assert.equal(f32ToF16(-0), 0x8000);
  assert.equal(f32ToF16(70000), 0x7c00);
  // the codec clamps instead: 1e5 and 65519 both go out as 65504
  assert.equal(toHex(encodePiece("fp16", Float32Array.of(1e5, -65519, 65519), 1)), "ff7bfffbff7b");
});

test("encoders refuse NaN, ±inf and |x| > 1e38; -sr needs a word source", () => {
  for (const name of ["fp16", "int8", "int4-chunk", "topk:0.5", "topk:0.5+int8"]) {
    for (const v of [NaN, Infinity, -Infinity, 2e38]) {
      assert.throws(() => encodePiece(name, Float32Array.of(1, v), 1), CodecError, `${name} ${v}`);
    }
  }
  assert.equal(encodePiece("fp32", Float32Array.of(NaN), 1).length, 4); // fp32 passes values as they are
  assert.throws(() => encodePiece("int8-sr", Float32Array.of(1), 1), CodecError);
  assert.throws(() => encodePiece("int8", [1, 2], 1), TypeError);
});

test("stochastic rounding: one word per value, zero rows included; unbiased", () => {
  let words = 0;
  const counter = { nextU32: () => (words++, 0x80000000) };
  encodePiece("int8-sr", Float32Array.of(0, 0, 0, 1, 2, 3), 2, { rand: counter });
  assert.equal(words, 6);
  words = 0;
  encodePiece("topk:0.5+int8-sr", Float32Array.of(0, 0, 0, 1, 2, 3), 1, { rand: counter });
  assert.equal(words, 3);
  const g = new Xoshiro(1, 1);
  const x = Float32Array.of(0.3, 1, -0.55, 0.01);
  const sum = new Float64Array(4);
  for (let i = 0; i < 4000; i++) {
    decodePiece(CodecId.INT4_CHUNK, encodePiece("int4-chunk-sr", x, 1, { rand: g }), 1, 4).forEach((v, j) => (sum[j] += v));
  }
  sum.forEach((s, j) => assert.ok(Math.abs(s / 4000 - x[j]) < 0.01, `mean of value ${j}: ${s / 4000}`));
  sum.fill(0); // int2's three levels are unbiased too, with a larger spread
  for (let i = 0; i < 4000; i++) {
    decodePiece(CodecId.INT2, encodePiece("int2-sr", x, 1, { rand: g }), 1, 4).forEach((v, j) => (sum[j] += v));
  }
  sum.forEach((s, j) => assert.ok(Math.abs(s / 4000 - x[j]) < 0.05, `int2 mean of value ${j}: ${s / 4000}`));
});

test("every codec: round trips within its error, sizes as announced", () => {
  const g = new Xoshiro(2, 0);
  for (const name of ["fp32", "fp16", "int8", "int4", "int8-chunk", "int4-chunk", "topk:0.3", "topk:0.3+int8",
    "int8-sr", "int4-sr", "int8-chunk-sr", "int4-chunk-sr", "topk:0.3+int8-sr", "int2", "int2-sr"]) {
    const c = parseCodec(name);
    for (const [rows, n] of [[1, 1], [1, 7], [3, 21], [4, 4], [5, 35]]) {
      const x = Float32Array.from({ length: n }, () => (g.nextU32() / 2 ** 32 - 0.5) * 10);
      const p = encodePiece(c, x, rows, { rand: g });
      assert.equal(p.length, encodedSize(c, rows, n), `${name} ${rows}x${n / rows}`);
      assert.equal(pieceSize(c.id, Uint8Array.of(...p, 9, 9, 9), rows, n), p.length);
      const d = decodePiece(c.id, p, rows, n);
      const m = Math.max(...x.map(Math.abs));
      const tol = { fp32: 0, fp16: 0.01, int: (m / c.levels) * (c.stochastic ? 1 : 0.5) * 1.0001 }[c.kind];
      if (c.kind !== "topk") x.forEach((v, i) => assert.ok(Math.abs(d[i] - v) <= tol, `${name}: ${d[i]} for ${v}`));
      else assert.equal(d.filter((v) => v !== 0).length, topkCount(n, c.fraction));
    }
  }
});

// -- decoding refusals (§11 "Decoding") -----------------------------------------------

function payload(parts) {
  const out = [];
  for (const [kind, v] of parts) {
    const b = new DataView(new ArrayBuffer(4));
    if (kind === "f") b.setFloat32(0, v, true);
    else if (kind === "I") b.setUint32(0, v, true);
    if (kind === "f" || kind === "I") out.push(...new Uint8Array(b.buffer));
    else out.push(...v); // raw bytes
  }
  return Uint8Array.from(out);
}

test("decoding refuses a wrong length for every codec", () => {
  for (const id of [0, 1, 2, 3, 6, 7, 8]) {
    const c = ["fp32", "fp16", "int8", "int4", null, null, "int8-chunk", "int4-chunk", "int2"][id];
    const good = encodePiece(c, Float32Array.of(1, 2, 3, 4, 5, 6), 2);
    assert.equal(decodePiece(id, good, 2, 6).length, 6);
    badChunk(() => decodePiece(id, good.subarray(1), 2, 6), "bytes");
    badChunk(() => decodePiece(id, Uint8Array.of(...good, 0), 2, 6), "bytes");
  }
  const t = encodePiece("topk:0.5", Float32Array.of(1, 2, 3, 4), 1);
  badChunk(() => decodePiece(4, t.subarray(0, t.length - 1), 1, 4), "bytes");
  badChunk(() => decodePiece(4, Uint8Array.of(1, 0, 0), 1, 4), "no count");
  badChunk(() => pieceSize(4, Uint8Array.of(1, 0, 0), 1, 4), "no count");
  badChunk(() => decodePiece(9, new Uint8Array(4), 1, 1), "unknown codec id 9");
  badChunk(() => decodePiece(8, Uint8Array.of(0, 0, 0x80, 0x3f, 0x2a), 2, 6), "bytes"); // 2 rows need 2 scales
});

test("decoding refuses bad scales: negative, non-finite, too large", () => {
  for (const s of [-1, NaN, Infinity, -Infinity, 1e38]) {
    badChunk(() => decodePiece(2, payload([["f", s], ["b", [1]]]), 1, 1), "scale");
    badChunk(() => decodePiece(7, payload([["f", s], ["b", [9]]]), 1, 1), "scale");
    badChunk(() => decodePiece(5, payload([["I", 1], ["I", 0], ["f", s], ["b", [1]]]), 1, 1), "scale");
  }
  // just above FLT_MAX / 127 is too large for int8, not for int4 (FLT_MAX / 7)
  badChunk(() => decodePiece(2, payload([["f", 2.7e36], ["b", [1]]]), 1, 1), "scale");
  assert.equal(decodePiece(7, payload([["f", 2.7e36], ["b", [9]]]), 1, 1)[0], Math.fround(2.7e36));
  assert.deepStrictEqual(f32list(decodePiece(2, payload([["f", -0], ["b", [1]]]), 1, 1)), [-0]); // -0 is >= 0
  assert.deepStrictEqual(f32list(decodePiece(2, payload([["f", 3.4e38 / 127], ["b", [1]]]), 1, 1)), [Math.fround(3.4e38 / 127)]);
});

test("decoding refuses int8 -128, int4 nibble 0 and a nonzero pad nibble", () => {
  badChunk(() => decodePiece(2, payload([["f", 1], ["b", [1, 0x80]]]), 1, 2), "-128");
  badChunk(() => decodePiece(6, payload([["f", 1], ["b", [0x80]]]), 1, 1), "-128");
  badChunk(() => decodePiece(5, payload([["I", 1], ["I", 0], ["f", 1], ["b", [0x80]]]), 1, 1), "-128");
  assert.deepStrictEqual(f32list(decodePiece(3, payload([["f", 1], ["b", [0x18]]]), 1, 2)), [0, -7]);
  assert.deepStrictEqual(f32list(decodePiece(3, payload([["f", 1], ["b", [0x98]]]), 1, 2)), [0, 1]);
  badChunk(() => decodePiece(3, payload([["f", 1], ["b", [0x80]]]), 1, 2), "nibble 0");
  badChunk(() => decodePiece(7, payload([["f", 1], ["b", [0x99, 0x19]]]), 1, 3), "pad");
  assert.deepStrictEqual(f32list(decodePiece(7, payload([["f", 1], ["b", [0x99, 0x09]]]), 1, 3)), [1, 1, 1]);
  // int2: q + 2 in 2-bit crumbs, value 4i + j in bits 2j of byte i; 0 and a set pad refused
  assert.deepStrictEqual(f32list(decodePiece(8, payload([["f", 2], ["b", [0b11101011]]]), 1, 4)), [2, 0, 0, 2]);
  assert.deepStrictEqual(f32list(decodePiece(8, payload([["f", 1], ["b", [0b00110110]]]), 1, 3)), [0, -1, 1]);
  badChunk(() => decodePiece(8, payload([["f", 1], ["b", [0b10110010]]]), 1, 4), "crumb 0");
  badChunk(() => decodePiece(8, payload([["f", 1], ["b", [0b01110110]]]), 1, 3), "pad");
});

test("decoding refuses top-k counts above n and indices that do not increase below n", () => {
  const topk = (k, idx, vals) => payload([["I", k], ...idx.map((i) => ["I", i]), ...vals.map((v) => ["f", v])]);
  assert.deepStrictEqual(f32list(decodePiece(4, topk(2, [1, 3], [5, -6]), 1, 4)), [0, 5, 0, -6]);
  badChunk(() => decodePiece(4, topk(5, [0, 1, 2, 3, 4], [1, 1, 1, 1, 1]), 1, 4), "keeps 5");
  badChunk(() => decodePiece(4, topk(2, [3, 1], [1, 1]), 1, 4), "increasing");
  badChunk(() => decodePiece(4, topk(2, [1, 1], [1, 1]), 1, 4), "increasing");
  badChunk(() => decodePiece(4, topk(2, [1, 4], [1, 1]), 1, 4), "below 4");
  badChunk(() => decodePiece(4, topk(1, [1], [NaN]), 1, 4), "non-finite");
  badChunk(() => decodePiece(4, topk(1, [1], [Infinity]), 1, 4), "non-finite");
  assert.deepStrictEqual(f32list(decodePiece(4, topk(0, [], []), 1, 4)), [0, 0, 0, 0]);
  const q = payload([["I", 2], ["I", 0], ["I", 2], ["f", 0.5], ["b", [2, 0xfe]]]);
  assert.deepStrictEqual(f32list(decodePiece(5, q, 1, 3)), [1, 0, -1]);
  badChunk(() => decodePiece(5, payload([["I", 1], ["I", 3], ["f", 1], ["b", [1]]]), 1, 3), "below 3");
});

test("decoding refuses non-finite halves", () => {
  badChunk(() => decodePiece(1, Uint8Array.of(0x00, 0x7c), 1, 1), "non-finite");
  badChunk(() => decodePiece(1, Uint8Array.of(0x01, 0xfe), 1, 1), "non-finite");
  assert.deepStrictEqual(f32list(decodePiece(1, Uint8Array.of(0xff, 0x7b, 0x01, 0x00), 1, 2)), [65504, 2 ** -24]);
});

test("decoding reads payloads at any byte offset", () => {
  const p = encodePiece("int8", Float32Array.of(1, -2, 3, 4, 5, 6), 2);
  const frame = new Uint8Array(p.length + 3);
  frame.set(p, 3);
  assert.deepStrictEqual(decodePiece(2, frame.subarray(3), 2, 6), decodePiece(2, p, 2, 6));
});
