// IEEE binary16 <-> float32 (the fp16 codec, §11; float16 ndarrays, §4).
//
// JavaScript has no half type, so the conversion works on float32 bit patterns.
// It must round to nearest with ties to even, subnormals included, to produce
// the same bytes as NumPy's astype(float16) (§11.1: the codec vectors pin it).

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The binary16 bits nearest to float32 `x` (ties to even): beyond the half range
 *  is ±inf, NaN a quiet NaN. A float64 argument is first rounded to float32, so
 *  pass float32 values (every caller does) to avoid double rounding. */
/** @param {number} x @returns {number} */
export function f32ToF16(x) {
  f32[0] = x;
  const b = u32[0];
  const sign = (b >>> 16) & 0x8000;
  const e = (b >>> 23) & 0xff;
  const m = b & 0x7fffff;
  if (e === 0xff) return sign | (m ? 0x7e00 : 0x7c00);
  const exp = e - 112; // rebias 127 -> 15
  if (exp >= 0x1f) return sign | 0x7c00;
  if (exp <= 0) {
    // A half subnormal counts units of 2^-24; the float32 value is M·2^(e-150)
    // with its implicit bit, i.e. M >> (14 - exp) units, rounded.
    const shift = 14 - exp;
    if (shift > 24) return sign; // below half of the smallest subnormal
    const M = m | 0x800000;
    let q = M >>> shift;
    const rem = M & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && q & 1)) q++;
    return sign | q; // q may carry into 0x400: the smallest normal, correctly
  }
  let q = (exp << 10) | (m >>> 13);
  const rem = m & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && q & 1)) q++; // a carry may reach inf: correct
  return sign | q;
}

/** @type {Float32Array | null} */
let TABLE = null;

/** The float32 value of binary16 bits `h` (exact: every half is a float32). */
/** @param {number} h @returns {number} */
export function f16ToF32(h) {
  if (TABLE === null) {
    // 256 KiB once, then decoding a large fp16 payload is one lookup per value.
    TABLE = new Float32Array(65536);
    for (let i = 0; i < 65536; i++) {
      const s = i & 0x8000 ? -1 : 1;
      const e = (i >>> 10) & 0x1f;
      const m = i & 0x3ff;
      if (e === 0) TABLE[i] = s * m * 2 ** -24;
      else if (e === 0x1f) TABLE[i] = m ? NaN : s * Infinity;
      else TABLE[i] = s * (1024 + m) * 2 ** (e - 25);
    }
  }
  return TABLE[h];
}
