// Update codecs (docs/protocol.md §11): a piece of a block <-> payload bytes.
//
// A piece is the rows one chunk takes from one block, seen flat (n values) with
// `rows` = its first dimension for a W piece and 1 for a bias piece (per-row
// codecs keep one scale per row). Encoders follow §11.1 to the bit, so two
// clients given the same update send the same bytes (compute/codecs.json);
// decoders trust nothing and refuse a bad payload with ProtocolError(BAD_CHUNK).
//
// Only the wire id travels: a codec's parameters (top-k's fraction, stochastic
// rounding) steer the encoder alone, so decoding needs just the id.

import { asBytes, bytesLE, readLE } from "./bytes.js";
import { ErrorCode, ProtocolError } from "./errors.js";
import { f16ToF32, f32ToF16 } from "./half.js";

/** Wire ids (never renumbered). */
export const CodecId = Object.freeze({
  FP32: 0,
  FP16: 1,
  INT8: 2,
  INT4: 3,
  TOPK: 4,
  TOPK_INT8: 5,
  INT8_CHUNK: 6,
  INT4_CHUNK: 7,
  INT2: 8,
});

/** A codec name that does not parse, or an input an encoder refuses (NaN, inf,
 *  |x| > 1e38): the caller's problem, never sent to the peer as-is. */
export class CodecError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = "CodecError";
  }
}

const F32_MAX = 3.4028234663852886e38;
/** Lossy encoders refuse larger magnitudes: a scale near FLT_MAX could round up
 *  and decode to inf (§11.1). */
const MAX_MAGNITUDE = 1e38;
/** 2^-20: what k's formula forgives a decimal fraction's binary error (§11.1). */
const TOPK_SLACK = 2 ** -20;
const U24 = 2 ** -24;

/** A parsed codec (parseCodec): what the encoder does; only `id` travels.
 *  @typedef {Readonly<{name: string, id: number, kind: "fp32" | "fp16" | "int" | "topk", bits: number, levels: number, perRow: boolean, fraction: number, quantized: boolean, stochastic: boolean, lossless: boolean}>} Codec */
/** @typedef {{id: number, kind: Codec["kind"], bits?: number, perRow?: boolean, lossless?: boolean}} CodecBase */
/** A source of 32-bit words for stochastic rounding (rng.js's Generator).
 *  @typedef {{nextU32(): number}} WordSource */

/** @type {Record<string, CodecBase>} */
const FIXED = {
  fp32: { id: 0, kind: "fp32", lossless: true },
  fp16: { id: 1, kind: "fp16" },
  int8: { id: 2, kind: "int", bits: 8, perRow: true },
  int4: { id: 3, kind: "int", bits: 4, perRow: true },
  "int8-chunk": { id: 6, kind: "int", bits: 8, perRow: false },
  "int4-chunk": { id: 7, kind: "int", bits: 4, perRow: false },
  int2: { id: 8, kind: "int", bits: 2, perRow: true },
};
const UNIFORM_SR = /^(int8|int4|int8-chunk|int4-chunk|int2)-sr$/;
/** Symmetric levels L of each integer width (§11.1: scale = max|x| / L).
 *  @type {Record<number, number>} */
const LEVELS = { 8: 127, 4: 7, 2: 1 };
const TOPK_NAME = /^topk:([0-9.eE+-]+?)(\+int8)?(-sr)?$/;

/** @param {string} name @param {CodecBase} base @param {Partial<Codec>} extra
 *  @returns {Codec} */
function describe(name, base, extra = {}) {
  const d = {
    name,
    id: base.id,
    kind: base.kind,
    bits: base.bits ?? 0,
    levels: LEVELS[base.bits ?? 0] ?? 0,
    perRow: base.perRow ?? false,
    fraction: 0,
    quantized: false,
    stochastic: false,
    lossless: base.lossless ?? false,
    ...extra,
  };
  return Object.freeze(d);
}

/** @type {Map<string, Codec>} */
const PARSED = new Map();

/** The codec named `name` (§11: fp32, fp16, int8, int4, int8-chunk, int4-chunk, int2,
 *  topk:<frac>, topk:<frac>+int8, and the -sr variants of the integer ones), as a
 *  frozen descriptor {name, id, kind, bits, levels, perRow, fraction, quantized,
 *  stochastic, lossless}. Throws CodecError for a name it does not know.
 *  @param {unknown} name
 *  @returns {Codec} */
export function parseCodec(name) {
  if (typeof name !== "string") throw new CodecError(`codec name must be a string, got ${typeof name}`);
  let c = PARSED.get(name);
  if (c) return c;
  if (Object.hasOwn(FIXED, name)) {
    c = describe(name, FIXED[name]);
  } else if (UNIFORM_SR.test(name)) {
    c = describe(name, FIXED[name.slice(0, -3)], { stochastic: true });
  } else {
    const m = TOPK_NAME.exec(name);
    if (m === null) {
      throw new CodecError(
        `unknown codec '${name}'; known: fp32, fp16, int8, int4, int8-chunk, int4-chunk, int2 ` +
          "or topk:FRACTION[+int8][-sr], int8|int4[-chunk][-sr], int2[-sr]",
      );
    }
    // Number() reads a decimal as the nearest float64, as §11 asks.
    const fraction = Number(m[1]);
    if (!(fraction > 0 && fraction <= 1)) throw new CodecError(`codec '${name}': fraction must be in (0, 1]`);
    if (m[3] && !m[2]) throw new CodecError(`codec '${name}': -sr needs +int8 (plain top-k does not round)`);
    const quantized = Boolean(m[2]);
    c = describe(name, { id: quantized ? 5 : 4, kind: "topk", bits: quantized ? 8 : 0 }, {
      fraction,
      quantized,
      stochastic: Boolean(m[3]),
    });
  }
  if (PARSED.size < 256) PARSED.set(name, c);
  return c;
}

/** A decoder for every wire id: the parameters do not travel, any instance of an
 *  id decodes every variant of it. */
const BY_ID = [
  "fp32", "fp16", "int8", "int4", "topk:0.01", "topk:0.01+int8", "int8-chunk", "int4-chunk", "int2",
].map(parseCodec);

/** Whether `id` is a codec wire id this client decodes. */
/** @param {unknown} id @returns {id is number} */
export function isKnownWireId(id) {
  return typeof id === "number" && Number.isInteger(id) && id >= 0 && id < BY_ID.length;
}

/** @param {string | Codec} codec */
function resolve(codec) {
  return typeof codec === "string" ? parseCodec(codec) : codec;
}

/** Top-k's count for n values: ceil(fraction·n − 2^-20) in float64, clamped to
 *  [1, n] (0 for n = 0), so that 7 % of 100 is 7, not 8 (§11.1). */
/** @param {number} n @param {number} fraction */
export function topkCount(n, fraction) {
  if (n === 0) return 0;
  return Math.min(n, Math.max(1, Math.ceil(fraction * n - TOPK_SLACK)));
}

/** @param {boolean} quantized @param {number} k */
function topkBytes(quantized, k) {
  return quantized ? 8 + 5 * k : 4 + 8 * k;
}

/** Exact payload bytes `codec` (name or descriptor) produces for a piece of `n`
 *  values in `rows` rows. */
/** @param {string | Codec} codec @param {number} rows @param {number} n @returns {number} */
export function encodedSize(codec, rows, n) {
  const c = resolve(codec);
  switch (c.kind) {
    case "fp32":
      return 4 * n;
    case "fp16":
      return 2 * n;
    case "int":
      return 4 * (c.perRow ? rows : 1) + Math.ceil((n * c.bits) / 8);
    default:
      return topkBytes(c.quantized, topkCount(n, c.fraction));
  }
}

// -- encoding ---------------------------------------------------------------------

/** @param {Float32Array} x @param {string} name */
function checkFinite(x, name) {
  for (let i = 0; i < x.length; i++) {
    if (!(Math.abs(x[i]) <= MAX_MAGNITUDE)) {
      throw new CodecError(`${name}: input holds a non-finite value (or |x| > 1e38) at ${i}`);
    }
  }
}

/** Round to nearest, ties to even (what IEEE rounding and NumPy's rint do). */
/** @param {number} y */
function rint(y) {
  const r = Math.round(y); // ties toward +inf
  return r - y === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** @param {Codec} c @param {WordSource | null} rand */
function wordSource(c, rand) {
  if (!c.stochastic) return null;
  if (!rand || typeof rand.nextU32 !== "function") {
    throw new CodecError(`${c.name}: stochastic rounding needs {rand} with nextU32() (§11.1)`);
  }
  return rand;
}

/** Quantise x[from, to) with one scale into q[from, to); returns the scale. */
/** @param {Float32Array} x @param {number} from @param {number} to @param {number} levels
 *  @param {Int8Array} q @param {WordSource | null} rand */
function quantizeRun(x, from, to, levels, q, rand) {
  let m = 0;
  for (let i = from; i < to; i++) {
    const a = Math.abs(x[i]);
    if (a > m) m = a;
  }
  // A division, not a multiplication by levels/m: a subnormal m would overflow it.
  const s = Math.fround(m / levels);
  for (let i = from; i < to; i++) {
    let v;
    const y = s > 0 ? Math.fround(x[i] / s) : 0;
    if (rand !== null) {
      // One word per value, zero-scale rows included, so the words stay in step.
      v = Math.floor(Math.fround(y + (rand.nextU32() >>> 8) * U24));
    } else {
      v = rint(y);
    }
    q[i] = v > levels ? levels : v < -levels ? -levels : v;
  }
  return s;
}

/** @param {Int8Array} q @param {Uint8Array} out @param {number} at */
function packNibbles(q, out, at) {
  for (let i = 0; i < q.length; i++) out[at + (i >> 1)] |= (q[i] + 8) << ((i & 1) * 4);
}

/** int2: q + 2 in the 2 bits 2j of byte i for value 4i + j (§11). */
/** @param {Int8Array} q @param {Uint8Array} out @param {number} at */
function packCrumbs(q, out, at) {
  for (let i = 0; i < q.length; i++) out[at + (i >> 2)] |= (q[i] + 2) << ((i & 3) * 2);
}

/** @param {Codec} c @param {Float32Array} x @param {number} rows @param {WordSource | null} rand */
function encodeUniform(c, x, rows, rand) {
  const n = x.length;
  const ns = c.perRow ? rows : 1;
  if (!(Number.isInteger(ns) && ns >= 1 && n % ns === 0)) {
    throw new CodecError(`${c.name}: ${n} values do not split into ${rows} rows`);
  }
  const cols = n / ns;
  const scales = new Float32Array(ns);
  const q = new Int8Array(n);
  for (let r = 0; r < ns; r++) scales[r] = quantizeRun(x, r * cols, (r + 1) * cols, c.levels, q, rand);
  const out = new Uint8Array(encodedSize(c, rows, n));
  out.set(bytesLE(scales), 0);
  if (c.bits === 8) out.set(new Uint8Array(q.buffer), 4 * ns);
  else if (c.bits === 4) packNibbles(q, out, 4 * ns);
  else packCrumbs(q, out, 4 * ns);
  return out;
}

/** k-th largest of `a` (1-based), reordering `a`: quickselect with a three-way
 *  partition, because updates hold long runs of equal magnitudes (zeros). */
/** @param {Float32Array} a @param {number} k */
function kthLargest(a, k) {
  const target = a.length - k; // its index in ascending order
  let lo = 0;
  let hi = a.length - 1;
  while (lo < hi) {
    const x = a[lo], y = a[(lo + hi) >>> 1], z = a[hi];
    const pivot = x < y ? (y < z ? y : x < z ? z : x) : x < z ? x : y < z ? z : y;
    let lt = lo, i = lo, gt = hi;
    while (i <= gt) {
      const v = a[i];
      if (v < pivot) {
        a[i++] = a[lt];
        a[lt++] = v;
      } else if (v > pivot) {
        a[i] = a[gt];
        a[gt--] = v;
      } else i++;
    }
    if (target < lt) hi = lt - 1;
    else if (target > gt) lo = gt + 1;
    else return pivot;
  }
  return a[lo];
}

/** Increasing flat indices of the k largest |x|; equal magnitudes go to the lower
 *  index (a partial sort's choice among ties would differ between clients). */
/** @param {Float32Array} x @param {number} k */
export function topIndices(x, k) {
  const n = x.length;
  if (k >= n) return Uint32Array.from({ length: n }, (_, i) => i);
  if (k <= 0) return new Uint32Array(0);
  const mag = new Float32Array(n);
  for (let i = 0; i < n; i++) mag[i] = Math.abs(x[i]);
  const t = kthLargest(Float32Array.from(mag), k);
  let above = 0;
  for (let i = 0; i < n; i++) if (mag[i] > t) above++;
  let ties = k - above;
  const out = new Uint32Array(k);
  let j = 0;
  for (let i = 0; i < n; i++) {
    const m = mag[i];
    if (m > t) out[j++] = i;
    else if (m === t && ties > 0) {
      out[j++] = i;
      ties--;
    }
  }
  return out;
}

/** @param {Codec} c @param {Float32Array} x @param {WordSource | null} rand */
function encodeTopk(c, x, rand) {
  const n = x.length;
  const k = topkCount(n, c.fraction);
  const idx = topIndices(x, k);
  const vals = new Float32Array(k);
  for (let j = 0; j < k; j++) vals[j] = x[idx[j]];
  const out = new Uint8Array(topkBytes(c.quantized, k));
  new DataView(out.buffer).setUint32(0, k, true);
  out.set(bytesLE(idx), 4);
  const at = 4 + 4 * k;
  if (!c.quantized) {
    out.set(bytesLE(vals), at);
  } else {
    const q = new Int8Array(k);
    const s = quantizeRun(vals, 0, k, 127, q, rand);
    new DataView(out.buffer).setFloat32(at, s, true);
    out.set(new Uint8Array(q.buffer), at + 4);
  }
  return out;
}

/** Encode one piece (a Float32Array of n values in `rows` rows; rows = 1 for a
 *  bias piece) with `codec` (a name or parseCodec's descriptor), bit-exact per
 *  §11.1. `rand` ({nextU32()}: the task's G(seed, 1), §12.1) is required by the
 *  -sr codecs; one word is drawn per value (per kept value for top-k). Throws
 *  CodecError for NaN, ±inf or |x| > 1e38 in a lossy codec's input. */
/** @param {string | Codec} codec @param {Float32Array} x @param {number} rows
 *  @param {{rand?: WordSource | null}} [options]
 *  @returns {Uint8Array} */
export function encodePiece(codec, x, rows, { rand = null } = {}) {
  const c = resolve(codec);
  if (!(x instanceof Float32Array)) throw new TypeError(`${c.name}: a piece must be a Float32Array`);
  if (c.kind === "fp32") return bytesLE(x); // values as they are, -0 included
  checkFinite(x, c.name);
  const words = wordSource(c, rand);
  if (c.kind === "fp16") {
    const h = new Uint16Array(x.length);
    for (let i = 0; i < x.length; i++) {
      const v = x[i];
      h[i] = f32ToF16(v > 65504 ? 65504 : v < -65504 ? -65504 : v);
    }
    return bytesLE(h);
  }
  if (c.kind === "int") return encodeUniform(c, x, rows, words);
  return encodeTopk(c, x, words);
}

// -- decoding ---------------------------------------------------------------------

/** @param {string} message */
function refuse(message) {
  return new ProtocolError(ErrorCode.BAD_CHUNK, message);
}

/** @param {unknown} wireId */
function codecOf(wireId) {
  if (!isKnownWireId(wireId)) throw refuse(`unknown codec id ${wireId}`);
  return BY_ID[wireId];
}

/** How many leading bytes of `data` encode a piece of n values in `rows` rows:
 *  how a spanning chunk's payload is split (§5.3). Fixed by the shape, except
 *  top-k's, which its count header gives. Throws ProtocolError(BAD_CHUNK). */
/** @param {number} wireId @param {Uint8Array} data @param {number} rows @param {number} n */
export function pieceSize(wireId, data, rows, n) {
  const c = codecOf(wireId);
  if (c.kind !== "topk") return encodedSize(c, rows, n);
  if (data.length < 4) throw refuse(`${c.name}: payload of ${data.length} bytes has no count`);
  return topkBytes(c.quantized, new DataView(data.buffer, data.byteOffset, 4).getUint32(0, true));
}

/** @param {ArrayLike<number>} scales @param {number} levels @param {string} name */
function checkScales(scales, levels, name) {
  const max = F32_MAX / levels;
  for (let i = 0; i < scales.length; i++) {
    const s = scales[i];
    if (!(s >= 0 && s <= max)) throw refuse(`${name}: payload holds a negative, too large or non-finite scale`);
  }
}

/** @param {Codec} c @param {Uint8Array} p @param {number} rows @param {number} n */
function decodeUniform(c, p, rows, n) {
  const ns = c.perRow ? rows : 1;
  const scales = readLE(Float32Array, p, 0, ns);
  checkScales(scales, c.levels, c.name);
  const cols = n / ns;
  const out = new Float32Array(n);
  const at = 4 * ns;
  if (c.bits === 8) {
    for (let r = 0, i = 0; r < ns; r++) {
      const s = scales[r];
      for (const end = i + cols; i < end; i++) {
        const b = p[at + i];
        if (b === 0x80) throw refuse(`${c.name}: value -128 is outside the symmetric range`);
        out[i] = ((b << 24) >> 24) * s;
      }
    }
  } else if (c.bits === 2) {
    if (n & 3 && p[at + (n >> 2)] >> ((n & 3) * 2)) throw refuse(`${c.name}: nonzero pad crumb`);
    for (let r = 0, i = 0; r < ns; r++) {
      const s = scales[r];
      for (const end = i + cols; i < end; i++) {
        const u = (p[at + (i >> 2)] >> ((i & 3) * 2)) & 3;
        if (u === 0) throw refuse(`${c.name}: crumb 0 is not a valid int2 value`);
        out[i] = (u - 2) * s;
      }
    }
  } else {
    if (n & 1 && p[at + (n >> 1)] >> 4) throw refuse(`${c.name}: nonzero pad nibble`);
    for (let r = 0, i = 0; r < ns; r++) {
      const s = scales[r];
      for (const end = i + cols; i < end; i++) {
        const u = (p[at + (i >> 1)] >> ((i & 1) * 4)) & 0xf;
        if (u === 0) throw refuse(`${c.name}: nibble 0 is not a valid int4 value`);
        out[i] = (u - 8) * s;
      }
    }
  }
  return out;
}

/** @param {Codec} c @param {Uint8Array} p @param {number} n */
function decodeTopk(c, p, n) {
  if (p.length < 4) throw refuse(`${c.name}: payload of ${p.length} bytes has no count`);
  const view = new DataView(p.buffer, p.byteOffset, p.byteLength);
  const k = view.getUint32(0, true);
  if (k > n) throw refuse(`${c.name}: payload keeps ${k} values of a ${n}-value piece`);
  if (p.length !== topkBytes(c.quantized, k)) {
    throw refuse(`${c.name}: payload has ${p.length} bytes, k=${k} needs ${topkBytes(c.quantized, k)}`);
  }
  const idx = readLE(Uint32Array, p, 4, k);
  for (let j = 0; j < k; j++) {
    if (idx[j] >= n || (j > 0 && idx[j] <= idx[j - 1])) {
      throw refuse(`${c.name}: indices not strictly increasing below ${n}`);
    }
  }
  const out = new Float32Array(n);
  const at = 4 + 4 * k;
  if (c.quantized) {
    const s = view.getFloat32(at, true);
    checkScales([s], 127, c.name);
    for (let j = 0; j < k; j++) {
      const b = p[at + 4 + j];
      if (b === 0x80) throw refuse(`${c.name}: value -128 is outside the symmetric range`);
      out[idx[j]] = ((b << 24) >> 24) * s;
    }
  } else {
    const vals = readLE(Float32Array, p, at, k);
    for (let j = 0; j < k; j++) {
      if (!Number.isFinite(vals[j])) throw refuse(`${c.name}: payload holds non-finite values`);
      out[idx[j]] = vals[j];
    }
  }
  return out;
}

/** Decode a piece of n values in `rows` rows (1 for a bias piece) from `payload`
 *  (a Uint8Array at any offset) encoded with wire id `wireId`. A value is q·scale
 *  in float32, the stored float, or the half widened (§11 "Decoding"). Throws
 *  ProtocolError(BAD_CHUNK) for every payload §11 says a receiver rejects. */
/** @param {number} wireId @param {ArrayBufferLike | ArrayBufferView} payload
 *  @param {number} rows @param {number} n @returns {Float32Array} */
export function decodePiece(wireId, payload, rows, n) {
  const c = codecOf(wireId);
  if (!(Number.isInteger(rows) && rows >= 1 && Number.isInteger(n) && n >= 0 && n % rows === 0)) {
    throw new TypeError(`decodePiece: ${n} values do not split into ${rows} rows`);
  }
  const p = asBytes(payload);
  if (c.kind === "topk") return decodeTopk(c, p, n);
  const want = encodedSize(c, rows, n);
  if (p.length !== want) throw refuse(`${c.name}: payload has ${p.length} bytes, the piece needs ${want}`);
  if (c.kind === "fp32") return readLE(Float32Array, p, 0, n);
  if (c.kind === "fp16") {
    const h = readLE(Uint16Array, p, 0, n);
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const v = f16ToF32(h[i]);
      if (!Number.isFinite(v)) throw refuse(`${c.name}: payload holds non-finite values`);
      out[i] = v;
    }
    return out;
  }
  return decodeUniform(c, p, rows, n);
}

// -- error feedback ---------------------------------------------------------------

/** Error feedback (§11.2): per piece, encode c = x + r and keep r ← c − decode(c),
 *  so what a lossy codec drops is sent late instead of lost. One instance per
 *  upload codec: start a new one when task.upload_codec changes. */
export class Residuals {
  /** @param codec name or descriptor of the upload codec; or null, to be bound
   *  by the first useCodec() (encodeTransfer calls it)
   *  @param {string | Codec | null} codec */
  constructor(codec = null) {
    /** @type {Codec | null} */
    this.codec = codec === null ? null : resolve(codec);
  }

  /** Residuals by piece key. @type {Map<string, Float32Array>} */
  #r = new Map();

  /** Encode with `codec` from now on. Another codec than before starts afresh:
   *  residuals of one codec mean nothing to another (§11.2). */
  /** @param {string | Codec} codec */
  useCodec(codec) {
    const c = resolve(codec);
    if (this.codec === null || this.codec.name !== c.name) {
      this.#r.clear();
      this.codec = c;
    }
    return this;
  }

  /** The key of a piece: rows [rowStart, rowEnd) of block (layer, part), the rows
   *  one chunk carries of one block, so the same keys recur in every result. */
  /** @param {number} layer @param {string} part @param {number} rowStart @param {number} rowEnd */
  static key(layer, part, rowStart, rowEnd) {
    return `${layer}\u0000${part}\u0000${rowStart}\u0000${rowEnd}`;
  }

  /** Encode piece `x` (+ its residual) and keep what the receiver will not see.
   *  The returned payload must be what is sent. */
  /** @param {string} key @param {Float32Array} x @param {number} rows
   *  @param {{rand?: WordSource | null}} [options] */
  encode(key, x, rows, { rand = null } = {}) {
    if (this.codec === null) throw new TypeError("Residuals: no codec yet (pass one, or call useCodec)");
    const r = this.#r.get(key);
    if (r !== undefined && r.length !== x.length) {
      throw new CodecError(`error feedback: piece ${JSON.stringify(key)} changed size ${r.length} -> ${x.length}`);
    }
    const c = Float32Array.from(x);
    // Float32Array stores round each double sum: the float32 addition, exactly
    // (a double holds the sum of two float32s with room for correct rounding).
    if (r !== undefined) for (let i = 0; i < c.length; i++) c[i] += r[i];
    const payload = encodePiece(this.codec, c, rows, { rand });
    if (this.codec.lossless) {
      this.#r.delete(key);
    } else {
      const d = decodePiece(this.codec.id, payload, rows, c.length);
      for (let i = 0; i < c.length; i++) c[i] -= d[i];
      this.#r.set(key, c);
    }
    return payload;
  }

  /** What is still owed for `key` (a copy), or null. */
  /** @param {string} key */
  residual(key) {
    const r = this.#r.get(key);
    return r === undefined ? null : Float32Array.from(r);
  }

  /** The keys of the pieces that have a residual, in the order first kept. */
  keys() {
    return [...this.#r.keys()];
  }

  /** Forget one piece's residual, or all of them. @param {string} [key] */
  reset(key) {
    if (key === undefined) this.#r.clear();
    else this.#r.delete(key);
  }

  get size() {
    return this.#r.size;
  }
}
