// The portable generator of docs/protocol.md §12.1: xoshiro128** 1.1 on 32-bit
// words, seeded from (seed, stream) by two rounds of murmur3's fmix32.
//
// Everything here must be bit-exact with the reference (nn/rng.py) and with
// tests/vectors/compute/rng.json: the batches a task trains on, the version-0
// weights and the stochastic rounding of uploads all come from it. So only
// 32-bit integer operations (Math.imul, shifts, `>>> 0`) and float64 sums that
// stay exact below 2^53 are used.

const TWO32 = 4294967296;
const TWO_M32 = 2.3283064365386963e-10; // 2^-32
const GOLDEN = 0x9e3779b9;

/**
 * x mod n for integers 0 <= x < 2^33, 1 <= n <= 2^32, exactly. Float64 `%` would
 * be exact too, but V8 compiles it to a call of fmod (~40 ns, most of a
 * permutation's cost). The rounded quotient is within 1 of the true one and
 * q·n < 2^34, so one correction of the exact remainder suffices.
 */
/** @param {number} x @param {number} n */
function umod(x, n) {
  const r = x - Math.floor(x / n) * n;
  return r < 0 ? r + n : r >= n ? r - n : r;
}

/** murmur3's 32-bit finaliser (a bijection of uint32), as an int32. */
/** @param {number} h */
function fmix32(h) {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h | 0;
}

/** [low, high] 32-bit words of a 64-bit seed given as a BigInt or a safe integer. */
/** @param {number | bigint} seed @returns {[number, number]} */
function seedWords(seed) {
  if (typeof seed === "bigint") {
    if (seed < 0n || seed >= 1n << 64n) throw new RangeError(`seed: must be in [0, 2**64), got ${seed}`);
    return [Number(seed & 0xffffffffn), Number(seed >> 32n)];
  }
  // A Number above 2^53 has already lost bits: drawing from it would silently
  // give other batches than the reference, so it is refused.
  if (!Number.isSafeInteger(seed) || seed < 0) {
    throw new RangeError(`seed: must be an integer in [0, 2**53) or a BigInt, got ${seed}`);
  }
  return [seed % TWO32, Math.floor(seed / TWO32)];
}

/** The four state words of G(seed, stream), as uint32 Numbers (§12.1 "Seeding"). */
/** @param {number | bigint} seed @param {number | bigint} stream */
export function seedState(seed, stream = 0) {
  const [lo, hi] = seedWords(seed);
  const st = typeof stream === "bigint" ? Number(stream) : stream;
  if (!Number.isInteger(st) || st < 0 || st >= TWO32) {
    throw new RangeError(`stream: must be an integer in [0, 2**32), got ${stream}`);
  }
  let a = lo | 0, b = hi | 0, c = st | 0, d = GOLDEN | 0;
  for (let round = 0; round < 2; round++) {
    a = fmix32(a ^ d);
    b = fmix32(b ^ a);
    c = fmix32(c ^ b);
    d = fmix32(d ^ c);
  }
  return [a >>> 0, b >>> 0, c >>> 0, d >>> 0];
}

/** xoshiro128** seeded as G(seed, stream). State words are kept as int32. */
export class Generator {
  /** @param {number | bigint} seed @param {number | bigint} stream */
  constructor(seed, stream = 0) {
    const [a, b, c, d] = seedState(seed, stream);
    this.s0 = a | 0;
    this.s1 = b | 0;
    this.s2 = c | 0;
    this.s3 = d | 0;
  }

  /** The state words as uint32 Numbers (for tests and debugging). */
  get state() {
    return [this.s0 >>> 0, this.s1 >>> 0, this.s2 >>> 0, this.s3 >>> 0];
  }

  /** The next 32-bit word, as a Number in [0, 2^32). */
  nextU32() {
    const s1 = this.s1;
    const x = Math.imul(s1, 5);
    const result = Math.imul((x << 7) | (x >>> 25), 9) >>> 0;
    const t = s1 << 9;
    let s0 = this.s0, s2 = this.s2, s3 = this.s3;
    s2 ^= s0;
    s3 ^= s1;
    const n1 = s1 ^ s2;
    s0 ^= s3;
    s2 ^= t;
    this.s0 = s0;
    this.s1 = n1;
    this.s2 = s2;
    this.s3 = (s3 << 11) | (s3 >>> 21);
    return result;
  }

  /** Uniform integer in [0, n), 1 <= n <= 2^32, by rejection (always draws a word). */
  /** @param {number} n */
  below(n) {
    if (!Number.isInteger(n) || n < 1 || n > TWO32) {
      throw new RangeError(`below: n must be an integer in [1, 2**32], got ${n}`);
    }
    const threshold = umod(TWO32 - n, n);
    let w;
    do w = this.nextU32();
    while (w < threshold);
    return umod(w, n);
  }

  /** Fisher–Yates from the top: a permutation of 0..n-1 as a Uint32Array. */
  /** @param {number} n */
  permutation(n) {
    const a = new Uint32Array(n);
    for (let i = 0; i < n; i++) a[i] = i;
    for (let i = n - 1; i > 0; i--) {
      const j = this.below(i + 1);
      const t = a[i];
      a[i] = a[j];
      a[j] = t;
    }
    return a;
  }

  /** One Irwin–Hall value (12 words) as float64: exact, since the sum stays < 2^36. */
  normal() {
    let acc = 0;
    for (let k = 0; k < 12; k++) acc += this.nextU32();
    return acc * TWO_M32 - 6;
  }

  /** out[offset + k] = float32(normal() · scale) for k < count (the §12.3 init),
   *  with the generator inlined: the huge preset draws 400 M words. */
  /** @param {Float32Array | Float64Array} out @param {number} scale */
  normalInto(out, scale, offset = 0, count = out.length - offset) {
    let s0 = this.s0, s1 = this.s1, s2 = this.s2, s3 = this.s3;
    const end = offset + count;
    for (let k = offset; k < end; k++) {
      let acc = 0;
      for (let r = 0; r < 12; r++) {
        const x = Math.imul(s1, 5);
        acc += Math.imul((x << 7) | (x >>> 25), 9) >>> 0;
        const t = s1 << 9;
        s2 ^= s0;
        s3 ^= s1;
        s1 ^= s2;
        s0 ^= s3;
        s2 ^= t;
        s3 = (s3 << 11) | (s3 >>> 21);
      }
      out[k] = (acc * TWO_M32 - 6) * scale;
    }
    this.s0 = s0;
    this.s1 = s1;
    this.s2 = s2;
    this.s3 = s3;
  }

  /** (nextU32() >> 8) · 2^-24: the uniform float32 in [0, 1) of stochastic rounding (§11.1). */
  uniform() {
    return (this.nextU32() >>> 8) * 5.960464477539063e-8;
  }
}
