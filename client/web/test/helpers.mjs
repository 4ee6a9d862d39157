// Shared by the wire-side tests: the conformance vectors and their JSON form
// (docs/protocol.md §10), and a word source for stochastic rounding.

import { readFileSync, readdirSync } from "node:fs";
import { NdArray } from "../src/wire.js";
import { toHex } from "../src/bytes.js";

export const VECTORS = new URL("../../../tests/vectors/", import.meta.url);

export function vectorBytes(name) {
  return new Uint8Array(readFileSync(new URL(`${name}.msgpack`, VECTORS)));
}

export function vectorJson(name) {
  return JSON.parse(readFileSync(new URL(`${name}.json`, VECTORS), "utf8"));
}

export function computeJson(name) {
  return JSON.parse(readFileSync(new URL(`compute/${name}.json`, VECTORS), "utf8"));
}

/** Names of every vector that has a frame (`<name>.msgpack`). */
export function frameVectors() {
  return readdirSync(VECTORS)
    .filter((f) => f.endsWith(".msgpack"))
    .map((f) => f.slice(0, -".msgpack".length))
    .sort();
}

/** A decoded value in the vectors' JSON form ($bin, $ndarray). */
export function toJson(v) {
  if (v instanceof Uint8Array) return { $bin: toHex(v) };
  if (v instanceof NdArray) return { $ndarray: { dtype: v.dtype, shape: v.shape, data: Array.from(v.data) } };
  if (typeof v === "bigint") return Number.isSafeInteger(Number(v)) ? Number(v) : v;
  if (Array.isArray(v)) return v.map(toJson);
  if (v !== null && typeof v === "object") {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, toJson(x)]));
  }
  return v;
}

/** A generator per §12.1 (xoshiro128** 1.1 seeded from (seed, stream)), enough
 *  for the codec tests: nextU32(). `seed` is a Number below 2^53 or a BigInt. */
export class Xoshiro {
  constructor(seed, stream) {
    const s = BigInt(seed);
    const fmix = (h) => {
      h ^= h >>> 16;
      h = Math.imul(h, 0x85ebca6b);
      h ^= h >>> 13;
      h = Math.imul(h, 0xc2b2ae35);
      h ^= h >>> 16;
      return h >>> 0;
    };
    let a = Number(s & 0xffffffffn);
    let b = Number((s >> 32n) & 0xffffffffn);
    let c = stream >>> 0;
    let d = 0x9e3779b9;
    for (let r = 0; r < 2; r++) {
      a = fmix(a ^ d);
      b = fmix(b ^ a);
      c = fmix(c ^ b);
      d = fmix(d ^ c);
    }
    this.s = [a, b, c, d];
  }

  nextU32() {
    const s = this.s;
    const rotl = (x, k) => ((x << k) | (x >>> (32 - k))) >>> 0;
    const result = Math.imul(rotl(Math.imul(s[1], 5) >>> 0, 7), 9) >>> 0;
    const t = (s[1] << 9) >>> 0;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3] >>> 0, 11);
    for (let i = 0; i < 4; i++) s[i] >>>= 0;
    return result;
  }
}

/** Values as an array where -0 stays -0 (deepStrictEqual compares with Object.is). */
export function f32list(a) {
  return Array.from(a);
}
