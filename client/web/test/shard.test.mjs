import { test } from "node:test";
import assert from "node:assert/strict";
import { ShardError, isSha256Hex, parseShard, sha256Hex, shardSize } from "../src/shard.js";
import { decodeFrame } from "../src/wire.js";
import { vectorBytes, vectorJson } from "./helpers.mjs";

/** A shard file built by hand (§13), for the refusals. */
function shard({ n, f, t = 0, c = 3, X, y, magic = "CGSHARD1" }) {
  const out = new Uint8Array(shardSize(n, f, t));
  const v = new DataView(out.buffer);
  out.set(new TextEncoder().encode(magic).subarray(0, 8), 0);
  [n, f, t, c].forEach((x, i) => v.setUint32(8 + 4 * i, x, true));
  X.forEach((x, i) => v.setFloat32(24 + 4 * i, x, true));
  const at = 24 + 4 * n * f;
  y.forEach((x, i) => (t === 0 ? v.setInt32(at + 4 * i, x, true) : v.setFloat32(at + 4 * i, x, true)));
  return out;
}

test("the data vector: a whole 3-row shard, named by its sha256", async () => {
  const msg = decodeFrame(vectorBytes("data"));
  assert.equal(msg.offset, 0);
  assert.equal(msg.size, msg.payload.length);
  assert.equal(await sha256Hex(msg.payload), msg.data);
  assert.equal(vectorJson("task_data").data, msg.data); // the task that names it
  assert.equal(vectorJson("fetch").data, msg.data);
  const s = parseShard(msg.payload);
  assert.deepStrictEqual([s.n, s.f, s.t, s.c], [3, 5, 0, 3]);
  assert.ok(s.X instanceof Float32Array);
  assert.deepStrictEqual(Array.from(s.X), [0, 0.5, 1, -1, 2, 1, 2, 3, 4, 5, -0.25, 0, 0, 0, 0.125]);
  assert.ok(s.y instanceof Int32Array);
  assert.deepStrictEqual(Array.from(s.y), [2, 0, 1]);
});

test("a shard at an odd offset in a frame parses (arrays are copied out)", () => {
  const blob = decodeFrame(vectorBytes("data")).payload;
  assert.ok(blob.byteOffset % 4 !== 0, "the vector's payload is unaligned in its frame");
  const copy = new Uint8Array(blob.length + 1).fill(7);
  copy.set(blob, 1);
  assert.deepStrictEqual(parseShard(copy.subarray(1)), parseShard(blob));
});

test("float targets (t >= 1)", () => {
  const s = parseShard(shard({ n: 2, f: 1, t: 2, c: 0, X: [1, 2], y: [0.5, -1, 2, 3] }));
  assert.ok(s.y instanceof Float32Array);
  assert.deepStrictEqual(Array.from(s.y), [0.5, -1, 2, 3]);
  assert.throws(() => parseShard(shard({ n: 2, f: 1, t: 2, c: 0, X: [1, 2], y: [0.5, NaN, 2, 3] })), /targets/);
});

test("every invalid shard is a ShardError", () => {
  const ok = { n: 2, f: 2, X: [1, 2, 3, 4], y: [0, 2] };
  assert.equal(parseShard(shard(ok)).n, 2);
  const bad = [
    [shard({ ...ok, magic: "CGSHARD2" }), /magic/],
    [shard(ok).subarray(0, 30), /header promises/],
    [Uint8Array.of(...shard(ok), 0), /header promises/],
    [new Uint8Array(10), /shorter/],
    [shard({ ...ok, y: [0, 3] }), /label 3/],
    [shard({ ...ok, y: [-1, 0] }), /label -1/],
    [shard({ ...ok, X: [1, Infinity, 3, 4] }), /X/],
    [shard({ ...ok, X: [1, NaN, 3, 4] }), /X/],
    [shard({ ...ok, c: 0 }), /classes 0/],
  ];
  for (const [blob, why] of bad) {
    assert.throws(() => parseShard(blob), (err) => err instanceof ShardError && why.test(err.message));
  }
  // rows or features of 0, and a header promising more than 2^53 bytes
  const zero = shard(ok);
  new DataView(zero.buffer).setUint32(8, 0, true);
  assert.throws(() => parseShard(zero), ShardError);
  const huge = shard(ok);
  new DataView(huge.buffer).setUint32(8, 2 ** 32 - 1, true);
  new DataView(huge.buffer).setUint32(12, 2 ** 32 - 1, true);
  assert.throws(() => parseShard(huge), /header promises/);
});

test("names: 64 lowercase hex digits; sha256Hex matches a known digest", async () => {
  assert.ok(isSha256Hex("a".repeat(64)));
  assert.ok(!isSha256Hex("A".repeat(64)));
  assert.ok(!isSha256Hex("a".repeat(63)));
  assert.ok(!isSha256Hex(null));
  assert.equal(
    await sha256Hex(new TextEncoder().encode("abc")),
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
  );
});

test("the pure-JS sha256 (no crypto.subtle: plain-http pages) agrees with WebCrypto", async () => {
  const { sha256 } = await import("@noble/hashes/sha256");
  const bytes = new Uint8Array(100_003).map((_, i) => (i * 7919) & 255);
  const want = Buffer.from(await crypto.subtle.digest("SHA-256", bytes)).toString("hex");
  assert.equal(Buffer.from(sha256(bytes)).toString("hex"), want);
  const saved = Object.getOwnPropertyDescriptor(globalThis, "crypto");
  Object.defineProperty(globalThis, "crypto", { value: undefined, configurable: true });
  try {
    assert.equal(await sha256Hex(bytes), want);
  } finally {
    Object.defineProperty(globalThis, "crypto", saved);
  }
});
