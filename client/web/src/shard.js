// Shard files: a client's training rows, named by the sha256 of their bytes (§13).
//
// The hash is what makes a shard trustworthy (the same name is the same rows on
// any server), so a client checks it before parsing, using, or caching the
// bytes; parseShard then checks that the bytes are a well-formed shard, because
// a hash only proves the server meant these bytes, not that they are sane.

import { sha256 as nobleSha256 } from "@noble/hashes/sha256";
import { readLE } from "./bytes.js";

const MAGIC = [0x43, 0x47, 0x53, 0x48, 0x41, 0x52, 0x44, 0x31]; // "CGSHARD1"
const HEADER_BYTES = 24;

/** A shard's rows: X [n·f] float32; y int32 labels [n] (t = 0, c classes) or
 *  float32 targets [n·t].
 *  @typedef {{n: number, f: number, t: number, c: number, X: Float32Array, y: Int32Array | Float32Array}} Shard */

/** A blob that is not a valid shard file; the message names what is wrong. */
export class ShardError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = "ShardError";
  }
}

/** 64 lowercase hex digits: the only form a shard name takes on the wire. */
/** @param {unknown} text @returns {text is string} */
export function isSha256Hex(text) {
  return typeof text === "string" && /^[0-9a-f]{64}$/.test(text);
}

/** Bytes of a shard with this shape (what a header promises). */
/** @param {number} n @param {number} f @param {number} t */
export function shardSize(n, f, t) {
  return HEADER_BYTES + 4 * n * f + 4 * n * Math.max(1, t);
}

/** Parse and check a shard file (§13). X is float32 row-major [n·f]; y is int32
 *  labels [n] when t = 0, else float32 targets [n·t]. Arrays are copies, so
 *  `bytes` may be dropped or reused. Throws ShardError.
 *  @param {Uint8Array} bytes
 *  @returns {Shard} */
export function parseShard(bytes) {
  if (!(bytes instanceof Uint8Array)) throw new TypeError("parseShard: expected a Uint8Array");
  if (bytes.length < HEADER_BYTES) {
    throw new ShardError(`shard: ${bytes.length} bytes, shorter than its ${HEADER_BYTES}-byte header`);
  }
  for (let i = 0; i < 8; i++) {
    if (bytes[i] !== MAGIC[i]) throw new ShardError("shard: wrong magic, expected CGSHARD1");
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = view.getUint32(8, true);
  const f = view.getUint32(12, true);
  const t = view.getUint32(16, true);
  const c = view.getUint32(20, true);
  if (n < 1 || f < 1) throw new ShardError(`shard: rows ${n} and features ${f} must be >= 1`);
  if (t === 0 && c < 1) throw new ShardError("shard: labelled shard (targets 0) with classes 0");
  // Products of u32 fields can pass 2^53 and round, but then they are far above
  // any real length, so the comparison still fails as it should.
  const want = shardSize(n, f, t);
  if (bytes.length !== want) {
    throw new ShardError(`shard: ${bytes.length} bytes, the header promises ${want}`);
  }
  const X = readLE(Float32Array, bytes, HEADER_BYTES, n * f);
  for (let i = 0; i < X.length; i++) {
    if (!Number.isFinite(X[i])) throw new ShardError("shard: X contains NaN or inf");
  }
  const yAt = HEADER_BYTES + 4 * n * f;
  let y;
  if (t === 0) {
    y = readLE(Int32Array, bytes, yAt, n);
    for (let i = 0; i < n; i++) {
      if (y[i] < 0 || y[i] >= c) throw new ShardError(`shard: label ${y[i]} of row ${i} outside [0, ${c})`);
    }
  } else {
    y = readLE(Float32Array, bytes, yAt, n * t);
    for (let i = 0; i < y.length; i++) {
      if (!Number.isFinite(y[i])) throw new ShardError("shard: targets contain NaN or inf");
    }
  }
  return { n, f, t, c, X, y };
}

/** sha256 of `bytes` as 64 lowercase hex digits. WebCrypto where it exists;
 *  a page served over plain http from another host than localhost has no
 *  `crypto.subtle` (it is for secure contexts only), and there @noble/hashes
 *  computes the same digest, so a shard is checked before use either way. */
export async function sha256Hex(/** @type {Uint8Array<ArrayBuffer>} */ bytes) {
  const subtle = globalThis.crypto?.subtle;
  const digest = subtle
    ? new Uint8Array(await subtle.digest("SHA-256", bytes))
    : nobleSha256(bytes);
  let s = "";
  for (const b of digest) s += b.toString(16).padStart(2, "0");
  return s;
}
