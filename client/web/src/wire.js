// Frames <-> messages (docs/protocol.md §2–§4, §7, §9, §10).
//
// decodeFrame turns one websocket binary frame into a validated message object
// {type, ...every field of its §3 table}: defaults filled in for keys left out,
// unknown keys dropped (§9), and anything else wrong a ProtocolError whose
// message names the field ("task.steps: expected int in [1, 1000000000], got 0").
// encodeMessage is the inverse for what a client sends. Messages are plain
// objects with the wire keys; bin is a Uint8Array, an ndarray an NdArray.
//
// Integers: a conforming server sends none above 2^53 − 1 (§1), so fields are
// Numbers. The tables' 64-bit ranges are still what a receiver accepts, so a
// larger one (int64/uint64 on the wire) arrives exactly, as a BigInt, rather
// than rounded; a float where an int belongs is refused unless it is integral
// and safe (JavaScript cannot tell 7.0 from 7).
//
// Two leniencies @msgpack/msgpack imposes, both harmless: invalid UTF-8 in a str
// decodes with U+FFFD instead of being MALFORMED, and there is no nesting limit
// (its decoder keeps an explicit stack, so depth cannot overflow ours).

import { Decoder, Encoder, ExtensionCodec } from "@msgpack/msgpack";
import { readLE, bytesLE } from "./bytes.js";
import { ErrorCode, ProtocolError } from "./errors.js";
import { f16ToF32, f32ToF16 } from "./half.js";
import { isSha256Hex } from "./shard.js";

export const PROTOCOL_VERSION = 1;
/** Message types a server sends; any other valid type from it is UNEXPECTED. */
export const SERVER_TYPES = Object.freeze(["welcome", "task", "chunk", "ack", "heartbeat", "error", "bye", "data"]);
/** Message types a client sends. */
export const CLIENT_TYPES = Object.freeze([
  "hello", "result", "chunk", "prefetch", "decline", "fetch", "heartbeat", "bye", "error",
]);
export const TASK_KINDS = Object.freeze(["train", "gradient", "evaluate", "distill"]);
export const ACTIVATIONS = Object.freeze(["relu", "tanh", "sigmoid", "identity"]);
export const LOSSES = Object.freeze(["mse", "softmax_ce"]);
export const INITS = Object.freeze(["he", "xavier"]);
/** Most blocks one chunk may span (chunk.blocks, §3.5). */
export const MAX_CHUNK_BLOCKS = 1 << 17;

// -- the messages as decodeFrame returns them (§3; defaults filled in) ----------------
//
// Int fields are typed `number`: a conforming peer sends none above 2^53 − 1 (§1).
// Only the seeds, whose range is all of uint64, are typed `number | bigint`.

/** @typedef {{bytes_per_s: number | null, messages_per_s: number | null, max_message_bytes: number, burst: number}} Limits */
/** @typedef {import("./spec.js").FullSpec} FullSpec */
/** @typedef {{type: "hello", version: number, client: string, platform: string, cores: number, memory: number, flops: number, limits: Limits | null, codecs: string[], token: string | null, resume: string | null, deltas: boolean, seeded_init: boolean, spans: boolean, data: boolean, init_schemes: string[], boundary: boolean, volunteer: string | null, kernel?: string}} Hello */
/** @typedef {{type: "welcome", version: number, session_id: string, resume_token: string, limits: Limits, heartbeat_interval: number, spans: boolean, prefetch: boolean, data: boolean, decline: boolean, job: string, volunteer: string}} Welcome */
/** @typedef {{type: "task", task_id: string, kind: string, model_version: number, spec: FullSpec, dataset: string, shard: number, indices: NdArray | null, steps: number, batch: number, optimizer: Record<string, number | string | boolean>, seed: number | bigint, deadline: number, base_version: number | null, model_transfer: string | null, num_chunks: number, upload_codec: string, error_feedback: boolean, delta_base: number | null, teacher_logits: NdArray | null, temperature: number, distill_alpha: number, init_seed: number | bigint | null, init_crc: number | null, data: string | null, init_scheme: string | null, subnet: NdArray | null, boundary: number | null}} Task */
/** @typedef {{type: "result", task_id: string, model_version: number, kind: string, num_chunks: number, loss: number | null, samples: number, steps: number, compute_seconds: number, metrics: Record<string, number>}} Result */
/** @typedef {{type: "chunk", transfer: string, seq: number, total: number, layer: number, part: string, row_start: number, row_end: number, codec: number, crc: number, blocks: number, payload: Uint8Array}} Chunk */
/** @typedef {{type: "ack", task_id: string, accepted: boolean, reason: string}} Ack */
/** @typedef {{type: "prefetch", task_id: string}} Prefetch */
/** @typedef {{type: "decline", task_id: string, reason: string}} Decline */
/** @typedef {{type: "heartbeat", seq: number, time: number, echo: number | null, held: number | null}} Heartbeat */
/** @typedef {{type: "error", code: number, message: string}} ErrorMessage */
/** @typedef {{type: "bye", reason: string, detail: string}} Bye */
/** @typedef {{type: "fetch", data: string, offset: number}} Fetch */
/** @typedef {{type: "data", data: string, offset: number, size: number, payload: Uint8Array}} Data */
/** @typedef {Hello | Welcome | Task | Result | Chunk | Ack | Prefetch | Decline | Heartbeat | ErrorMessage | Bye | Fetch | Data} Message */
/** A message to encode: its type and wire keys, any left out at their default.
 *  @typedef {{type: string, [key: string]: unknown}} OutMessage */

const U32 = 2 ** 32 - 1;
const I64 = 2n ** 63n - 1n;
const U64 = 2n ** 64n - 1n;

// -- the ndarray extension (§4) ----------------------------------------------------

const NDARRAY_EXT = 1;
const MAX_NDIM = 4;
/** Largest element count accepted, checked before anything is allocated. */
const MAX_ELEMENTS = 2 ** 26;
/** The element arrays an ndarray holds (float16 is widened to Float32Array).
 *  @typedef {Float32Array | Uint16Array | Int8Array | Uint8Array | Int32Array | Uint32Array} NdData */

/** @type {{name: string, size: number, Ctor: {new (buffer: ArrayBuffer): NdData, new (length: number): NdData, readonly BYTES_PER_ELEMENT: number, from(values: ArrayLike<number>): NdData}}[]} */
const DTYPES = [
  { name: "float32", size: 4, Ctor: Float32Array },
  { name: "float16", size: 2, Ctor: Uint16Array }, // widened to Float32Array on decode
  { name: "int8", size: 1, Ctor: Int8Array },
  { name: "uint8", size: 1, Ctor: Uint8Array },
  { name: "int32", size: 4, Ctor: Int32Array },
  { name: "uint32", size: 4, Ctor: Uint32Array },
];

/** An array from (or for) the wire: `dtype` as sent, `shape` as an array, `data`
 *  the values in C order, a fresh aligned TypedArray (float16 widened to a
 *  Float32Array, since JavaScript has no half type). */
export class NdArray {
  /** @param {string} dtype @param {number[]} shape @param {NdData} data */
  constructor(dtype, shape, data) {
    this.dtype = dtype;
    this.shape = shape;
    this.data = data;
  }

  get size() {
    return this.data.length;
  }
}

/** @param {Uint8Array} bytes */
function unpackNdarray(bytes) {
  const where = "ndarray";
  if (bytes.length < 4) throw new ProtocolError(ErrorCode.MALFORMED, `${where}: ext of ${bytes.length} bytes is too short`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const code = bytes[0];
  const ndim = bytes[1];
  const reserved = view.getUint16(2, true);
  const dt = DTYPES[code];
  if (dt === undefined) throw new ProtocolError(ErrorCode.BAD_FIELD, `${where}: dtype code ${code} not allowed`);
  if (ndim > MAX_NDIM || reserved) {
    throw new ProtocolError(ErrorCode.BAD_FIELD, `${where}: ndim ${ndim} / reserved ${reserved} invalid`);
  }
  const start = 4 + 4 * ndim;
  if (bytes.length < start) throw new ProtocolError(ErrorCode.MALFORMED, `${where}: shape truncated`);
  /** @type {number[]} */
  const shape = [];
  let count = 1;
  for (let i = 0; i < ndim; i++) {
    shape.push(view.getUint32(4 + 4 * i, true));
    count *= shape[i];
  }
  if (count > MAX_ELEMENTS) {
    throw new ProtocolError(ErrorCode.TOO_LARGE, `${where}: ${count} elements exceed the limit of ${MAX_ELEMENTS}`);
  }
  if (bytes.length - start !== count * dt.size) {
    throw new ProtocolError(
      ErrorCode.MALFORMED,
      `${where}: shape [${shape}] of ${dt.name} needs ${count * dt.size} data bytes, got ${bytes.length - start}`,
    );
  }
  let data = readLE(dt.Ctor, bytes, start, count);
  if (dt.name === "float16") {
    const wide = new Float32Array(count);
    for (let i = 0; i < count; i++) wide[i] = f16ToF32(data[i]);
    data = wide;
  }
  return new NdArray(dt.name, shape, data);
}

/** @param {NdArray} arr */
function packNdarray(arr) {
  const code = DTYPES.findIndex((d) => d.name === arr.dtype);
  if (code < 0) throw new TypeError(`ndarray: dtype ${arr.dtype} not allowed`);
  const dt = DTYPES[code];
  let count = 1;
  for (const s of arr.shape) count *= s;
  if (arr.shape.length > MAX_NDIM || count !== arr.data.length) {
    throw new TypeError(`ndarray: shape [${arr.shape}] does not fit ${arr.data.length} values`);
  }
  let data = arr.data;
  if (dt.name === "float16") data = Uint16Array.from(Float32Array.from(data), f32ToF16);
  else if (!(data instanceof dt.Ctor)) data = dt.Ctor.from(data);
  const out = new Uint8Array(4 + 4 * arr.shape.length + count * dt.size);
  const view = new DataView(out.buffer);
  out[0] = code;
  out[1] = arr.shape.length;
  arr.shape.forEach((s, i) => view.setUint32(4 + 4 * i, s, true));
  out.set(bytesLE(data), 4 + 4 * arr.shape.length);
  return out;
}

/** Ext type 1 is an ndarray; any other ext type (the timestamp included) is
 *  MALFORMED (§4), so nothing unknown reaches a message. */
class WireExtensions extends ExtensionCodec {
  constructor() {
    super();
    this.register({
      type: NDARRAY_EXT,
      encode: (obj) => (obj instanceof NdArray ? packNdarray(obj) : null),
      decode: unpackNdarray,
    });
  }

  /** @override
   *  @param {Uint8Array} data @param {number} extType @param {undefined} context */
  decode(data, extType, context) {
    if (extType === NDARRAY_EXT) return unpackNdarray(data);
    throw new ProtocolError(ErrorCode.MALFORMED, `unknown msgpack ext type ${extType}`);
  }
}

const EXTENSIONS = new WireExtensions();

// -- framing -----------------------------------------------------------------------

/** @param {unknown} key */
function strKey(key) {
  if (typeof key !== "string") throw new ProtocolError(ErrorCode.MALFORMED, "a map key is not a str");
  return key;
}

/** One frame as plain wire values (ndarrays decoded, nothing validated). The
 *  framing rules still hold: a frame above `maxBytes` is TOO_LARGE before it is
 *  parsed; anything not exactly one msgpack value is MALFORMED. Every msgpack
 *  length is limited to the frame's size, so a hostile header cannot make the
 *  decoder allocate beyond a small multiple of the frame. Bin values are views
 *  into `bytes`.
 *  @param {Uint8Array | ArrayBuffer | string} bytes
 *  @returns {unknown} */
export function decodeRaw(bytes, maxBytes = Infinity) {
  if (typeof bytes === "string") throw new ProtocolError(ErrorCode.MALFORMED, "a text frame; the protocol is binary");
  const frame = bytes instanceof ArrayBuffer ? new Uint8Array(bytes) : bytes;
  if (!(frame instanceof Uint8Array)) throw new TypeError("decodeRaw: expected a Uint8Array or ArrayBuffer");
  if (frame.length > maxBytes) {
    throw new ProtocolError(ErrorCode.TOO_LARGE, `frame of ${frame.length} bytes exceeds ${maxBytes}`);
  }
  const lim = Math.max(frame.length, 1);
  const decoder = new Decoder({
    extensionCodec: EXTENSIONS,
    useBigInt64: true,
    mapKeyConverter: strKey,
    maxStrLength: lim,
    maxBinLength: lim,
    maxArrayLength: lim,
    maxMapLength: lim,
    maxExtLength: lim,
  });
  try {
    return decoder.decode(frame);
  } catch (exc) {
    if (exc instanceof ProtocolError) throw exc;
    // msgpack throws RangeError (truncated, trailing bytes) or DecodeError (bad
    // byte, length over the limit): all mean "not one msgpack value".
    const why = exc instanceof Error ? exc.message : exc;
    throw new ProtocolError(ErrorCode.MALFORMED, `frame is not one msgpack value (${why})`);
  }
}

/** @param {unknown} v @returns {v is Record<string, unknown>} */
function isMap(v) {
  return v !== null && typeof v === "object" && Object.getPrototypeOf(v) === Object.prototype;
}

/** One frame -> one validated message (see the module comment).
 *  @param {Uint8Array | ArrayBuffer | string} bytes
 *  @returns {Message} */
export function decodeFrame(bytes, maxBytes = Infinity) {
  const obj = decodeRaw(bytes, maxBytes);
  if (!isMap(obj)) throw new ProtocolError(ErrorCode.MALFORMED, `frame is a ${kindOf(obj)}, not a map`);
  const type = Object.hasOwn(obj, "type") ? obj.type : undefined;
  if (typeof type !== "string" || !Object.hasOwn(SCHEMAS, type)) {
    throw new ProtocolError(ErrorCode.UNKNOWN_TYPE, `type: unknown message type ${show(type)}`);
  }
  const schema = SCHEMAS[type];
  // The schema of `type` checked every field: the object is that message.
  return /** @type {Message} */ (validate(schema, type, obj));
}

// -- field checks: (wire value, where) -> value ------------------------------------------

/** @param {unknown} v */
function kindOf(v) {
  if (v === null || v === undefined) return "nil";
  if (Array.isArray(v)) return "list";
  if (v instanceof Uint8Array) return "bin";
  if (v instanceof NdArray) return "ndarray";
  if (isMap(v)) return "map";
  return typeof v;
}

/** A short rendering of a bad value that never prints a huge one in full. */
/** @param {unknown} v */
function show(v) {
  if (v === null || v === undefined) return "nil";
  if (v instanceof Uint8Array) return `<${v.length} bytes>`;
  if (v instanceof NdArray) return `<ndarray ${v.dtype} [${v.shape}]>`;
  if (Array.isArray(v)) return `<list of ${v.length}>`;
  if (isMap(v)) return `<map of ${Object.keys(v).length}>`;
  if (typeof v === "string") return `'${v.length > 60 ? `${v.slice(0, 57)}...` : v}'`;
  return String(v);
}

/** Python's "%g", which the reference's messages use for ranges. */
/** @param {number | bigint} x */
function g(x) {
  if (typeof x === "bigint" || x === 0 || !Number.isFinite(x)) return String(x);
  const e = Math.floor(Math.log10(Math.abs(x)));
  if (e >= -4 && e < 6) return String(x);
  const [mant, exp] = x.toExponential().split("e");
  return `${mant}e${exp[0]}${exp.slice(1).padStart(2, "0")}`;
}

/** @param {string} where @param {string} expected @param {unknown} got */
function bad(where, expected, got) {
  return new ProtocolError(ErrorCode.BAD_FIELD, `${where}: expected ${expected}, got ${show(got)}`);
}

/** @param {string} message */
function fail(message) {
  return new ProtocolError(ErrorCode.BAD_FIELD, message);
}

const MAX_SAFE = Number.MAX_SAFE_INTEGER;

/** A field check: the wire value (as decoded) and where it is -> the value the
 *  message holds, or a ProtocolError. `isInt`: an int field (wireInt on encode).
 *  @typedef {((v: unknown, where: string) => unknown) & {isInt?: boolean}} Check */

/** @param {number | bigint} lo @param {number | bigint} hi */
function int(lo, hi) {
  /** @type {Check} */
  const check = (v, where) => {
    if (typeof v === "number") {
      if (Number.isSafeInteger(v) && v >= lo && v <= hi) return v;
    } else if (typeof v === "bigint" && v >= lo && v <= hi) {
      return v >= -MAX_SAFE && v <= MAX_SAFE ? Number(v) : v;
    }
    throw bad(where, `int in [${lo}, ${hi}]`, v);
  };
  check.isInt = true;
  return check;
}

/** @param {number} lo @param {number} hi */
function num(lo, hi, { inf = false } = {}) {
  return (/** @type {unknown} */ v, /** @type {string} */ where) => {
    const x = typeof v === "bigint" ? Number(v) : v;
    if (typeof x === "number" && ((x >= lo && x <= hi) || (inf && x === Infinity))) return x;
    throw bad(where, `finite number in [${g(lo)}, ${g(hi)}]`, v);
  };
}

/** Code points of `s`, counted only when the UTF-16 length leaves a doubt. */
/** @param {string} s @param {number} max */
function codePoints(s, max) {
  if (s.length <= max || s.length > 2 * max) return s.length;
  let n = 0;
  for (const _ of s) n++;
  return n;
}

/** @param {number} max
 *  @param {{empty?: boolean, choices?: readonly string[] | null}} [options] */
function str(max, { empty = true, choices = null } = {}) {
  return (/** @type {unknown} */ v, /** @type {string} */ where) => {
    if (typeof v !== "string" || codePoints(v, max) > max || (!empty && v.length === 0)) {
      throw bad(where, `${empty ? "" : "non-empty "}string of <= ${max} chars`, v);
    }
    if (choices !== null && !choices.includes(v)) throw bad(where, `one of [${choices.join(", ")}]`, v);
    return v;
  };
}

/** A short token (hello.kernel): `a-z 0-9 . -`, at most `max` characters, or empty.
 *  @param {number} max */
function word(max) {
  return (/** @type {unknown} */ v, /** @type {string} */ where) => {
    if (typeof v !== "string" || v.length > max || !/^[a-z0-9.-]*$/.test(v)) {
      throw bad(where, `string of <= ${max} chars of a-z 0-9 . -`, v);
    }
    return v;
  };
}

/** @param {unknown} v @param {string} where */
function bool(v, where) {
  if (typeof v !== "boolean") throw bad(where, "bool", v);
  return v;
}

/** @param {unknown} v @param {string} where */
function bin(v, where) {
  if (!(v instanceof Uint8Array)) throw bad(where, "bin (bytes)", v);
  return v;
}

/** @param {Check} check */
function opt(check) {
  /** @type {Check} */
  const wrapped = (v, where) => (v === null || v === undefined ? null : check(v, where));
  wrapped.isInt = check.isInt === true;
  return wrapped;
}

/** @param {number} maxItems @param {number} maxLen */
function strs(maxItems, maxLen) {
  const item = str(maxLen, { empty: false });
  return (/** @type {unknown} */ v, /** @type {string} */ where) => {
    if (!Array.isArray(v) || v.length > maxItems) throw bad(where, `array of <= ${maxItems} strings`, v);
    return v.map((x, i) => item(x, `${where}[${i}]`));
  };
}

/** A small str-keyed map of scalars (optimizer config, metrics). */
/** @param {number} maxItems */
function scalars(maxItems, { numbersOnly = false } = {}) {
  const key = str(64, { empty: false });
  const number = num(-1e300, 1e300);
  const text = str(256);
  return (/** @type {unknown} */ v, /** @type {string} */ where) => {
    if (!isMap(v) || Object.keys(v).length > maxItems) throw bad(where, `map of <= ${maxItems} entries`, v);
    /** @type {Record<string, unknown>} */
    const out = {};
    for (const [k, x] of Object.entries(v)) {
      key(k, `${where} key`);
      if (typeof x === "boolean" && !numbersOnly) out[k] = x;
      else if (typeof x === "string" && !numbersOnly) out[k] = text(x, `${where}.${k}`);
      else out[k] = number(x, `${where}.${k}`);
    }
    return out;
  };
}

/** @param {unknown} v @param {string} where */
function indices(v, where) {
  if (!(v instanceof NdArray) || v.shape.length !== 1 || (v.dtype !== "int32" && v.dtype !== "uint32")) {
    throw bad(where, "1-D int32/uint32 ndarray", v);
  }
  if (v.dtype === "int32") {
    for (const i of v.data) if (i < 0) throw bad(where, "non-negative sample indices", i);
  }
  return v;
}

/** @param {unknown} v @param {string} where */
function logits(v, where) {
  if (!(v instanceof NdArray) || v.shape.length !== 2 || (v.dtype !== "float32" && v.dtype !== "float16")) {
    throw bad(where, "2-D float32/float16 ndarray", v);
  }
  for (const x of v.data) if (!Number.isFinite(x)) throw bad(where, "finite values", "non-finite");
  return v;
}

/** @param {unknown} v @param {string} where */
function sha256(v, where) {
  if (!isSha256Hex(v)) throw bad(where, "sha256 as 64 lowercase hex digits", v);
  return v;
}

const SPEC_KEYS = ["widths", "activations", "loss", "init"];
const width = int(1, 1 << 20);

/** The model spec (§3.11), with its defaults filled in. Unlike a message it is
 *  closed: a key this client does not know could mean a different network. */
/** @param {unknown} v @param {string} where */
function spec(v, where) {
  if (!isMap(v)) throw bad(where, "model spec map", v);
  const extra = Object.keys(v).filter((k) => !SPEC_KEYS.includes(k));
  if (extra.length) throw fail(`${where}: unknown field(s) [${extra.join(", ")}]`);
  const widths = v.widths;
  if (!Array.isArray(widths) || widths.length < 2 || widths.length > 64) {
    throw bad(`${where}.widths`, "array of 2..64 ints", widths);
  }
  widths.forEach((w, i) => width(w, `${where}.widths[${i}]`));
  const L = widths.length - 1;
  const given = Object.hasOwn(v, "activations") ? v.activations : [];
  if (!Array.isArray(given)) throw bad(`${where}.activations`, `array of ${L} activations`, given);
  /** @type {unknown[]} */
  let acts = given;
  // An empty list is the default, as the reference reads it.
  if (acts.length === 0) acts = Array.from({ length: L }, (_, i) => (i + 1 < L ? "relu" : "identity"));
  if (acts.length !== L) throw bad(`${where}.activations`, `${L} activations (one per layer)`, acts);
  const act = str(32, { choices: ACTIVATIONS });
  const activations = acts.map((a, i) => act(a, `${where}.activations[${i}]`));
  const loss = Object.hasOwn(v, "loss") ? str(32, { choices: LOSSES })(v.loss, `${where}.loss`) : "softmax_ce";
  const init = Object.hasOwn(v, "init") ? str(32, { choices: INITS })(v.init, `${where}.init`) : "he";
  return { widths: widths.map(Number), activations, loss, init };
}

const rate = num(1e-9, 1e300, { inf: true });
const maxMessageBytes = int(1024, I64);
const burst = num(1e-6, 1e6);

/** Link limits (§3.10); a rate of nil (or +inf) is "no limit" and reads as null. */
/** @param {unknown} v @param {string} where */
function limits(v, where) {
  if (!isMap(v)) throw bad(where, "link limits map", v);
  for (const k of ["bytes_per_s", "messages_per_s", "max_message_bytes"]) {
    if (!Object.hasOwn(v, k)) throw fail(`${where}.${k}: missing`);
  }
  /** @param {string} k */
  const r = (k) => (v[k] === null ? null : rate(v[k], `${where}.${k}`));
  const bps = r("bytes_per_s");
  const mps = r("messages_per_s");
  return {
    bytes_per_s: bps === Infinity ? null : bps,
    messages_per_s: mps === Infinity ? null : mps,
    max_message_bytes: maxMessageBytes(v.max_message_bytes, `${where}.max_message_bytes`),
    burst: Object.hasOwn(v, "burst") ? burst(v.burst, `${where}.burst`) : 1.0,
  };
}

// -- messages (§3, in each table's wire order) -------------------------------------------

const REQ = Symbol("required");
const taskId = str(128, { empty: false });
const kind = str(32, { choices: TASK_KINDS });

/** §3.3.1: a subnet's indices split by the spec's hidden widths, increasing within
 *  each layer, and its slice always travels. */
/** @param {Task & {subnet: NdArray}} m */
function subnetCross(m) {
  const hidden = m.spec.widths.slice(1, -1);
  const total = hidden.reduce((a, b) => a + b, 0);
  if (m.subnet.size !== total) throw bad("task.subnet", `${total} indices (spec's hidden widths)`, m.subnet.size);
  let at = 0;
  for (const n of hidden) {
    for (let i = at + 1; i < at + n; i++) {
      if (!(m.subnet.data[i] > m.subnet.data[i - 1])) throw bad("task.subnet", "increasing indices within each layer", "not");
    }
    at += n;
  }
  if (!m.num_chunks || m.base_version !== null || m.delta_base !== null) {
    throw fail("task.subnet: needs its slice as chunks (num_chunks > 0), no base_version and no delta_base");
  }
}

/** @param {Task} m */
function taskCross(m) {
  if (m.subnet !== null) subnetCross({ ...m, subnet: m.subnet });
  if (m.boundary !== null) {
    const hidden = m.spec.widths.length - 2;
    if (m.kind !== "train" || m.boundary > hidden) {
      throw bad("task.boundary", `a hidden layer 1..${hidden} of a train task's spec`, m.boundary);
    }
  }
  if (m.init_seed !== null) {
    if (m.init_crc === null || m.model_version !== 0 || m.num_chunks || m.base_version !== null || m.delta_base !== null) {
      throw fail(
        "task.init_seed: only for model_version 0, with init_crc, no chunks, no base_version and no delta_base",
      );
    }
  } else {
    if (m.init_crc !== null) throw fail("task.init_crc: only with init_seed");
    if (m.init_scheme !== null) throw fail("task.init_scheme: only with init_seed");
    if (m.num_chunks && m.model_transfer === null) throw fail("task.model_transfer: required when num_chunks > 0");
    if (m.model_transfer !== null && !m.num_chunks) {
      throw fail("task.num_chunks: must be > 0 when model_transfer is set");
    }
    if (m.base_version === null && !m.num_chunks) throw fail("task.num_chunks: need base_version or num_chunks > 0");
    if (m.delta_base !== null) {
      if (!m.num_chunks || m.base_version !== null) {
        throw fail("task.delta_base: needs model chunks (num_chunks > 0) and no base_version");
      }
      if (m.delta_base >= m.model_version) {
        throw bad("task.delta_base", `< model_version (${m.model_version})`, m.delta_base);
      }
    }
  }
  if (m.kind === "distill") {
    const t = m.teacher_logits;
    if (t === null || m.indices === null) throw fail("task.teacher_logits: a distill task needs them and indices");
    const outs = m.spec.widths[m.spec.widths.length - 1];
    if (t.shape[0] !== m.indices.size || t.shape[1] !== outs) {
      throw bad("task.teacher_logits", `shape [${m.indices.size}, ${outs}] (indices × outputs)`, t);
    }
  }
}

/** @param {Chunk} m */
function chunkCross(m) {
  if (m.seq >= m.total) throw bad("chunk.seq", `< total (${m.total})`, m.seq);
  if (m.blocks === 1 && m.row_end <= m.row_start) throw bad("chunk.row_end", `> row_start (${m.row_start})`, m.row_end);
}

/** @param {Data} m */
function dataCross(m) {
  if (m.offset + m.payload.length > m.size) throw bad("data.payload", `to end by size (${m.size})`, m.offset);
}

/** type -> {fields: [name, check, default or REQ], sparse: keys left off the wire
 *  at their default (§10 rule 3), cross: checks between fields}. `cross` is a
 *  method (bivariant): each schema's takes its own message.
 *  @typedef {{fields: [string, Check, unknown][], sparse?: string[], cross?(m: Message): void}} Schema */
/** @type {Record<string, Schema>} */
const SCHEMAS = {
  hello: {
    fields: [
      ["version", int(0, 65535), PROTOCOL_VERSION],
      ["client", str(64, { empty: false }), REQ],
      ["platform", str(64), ""],
      ["cores", int(1, 4096), 1],
      ["memory", int(0, I64), 0],
      ["flops", num(0, 1e18), 0.0],
      ["limits", opt(limits), null],
      ["codecs", strs(32, 32), ["fp32"]],
      ["token", opt(str(512)), null],
      ["resume", opt(str(128)), null],
      ["deltas", bool, false],
      ["seeded_init", bool, false],
      ["spans", bool, false],
      ["data", bool, false],
      ["init_schemes", strs(8, 32), []],
      ["boundary", bool, false],
      ["volunteer", opt(str(128)), null],
      ["kernel", word(32), ""],
    ],
    sparse: ["data", "init_schemes", "boundary", "volunteer", "kernel"],
  },
  welcome: {
    fields: [
      ["version", int(0, 65535), PROTOCOL_VERSION],
      ["session_id", str(128, { empty: false }), REQ],
      ["resume_token", str(128), ""],
      ["limits", limits, REQ],
      ["heartbeat_interval", num(0.001, 3600), 5.0],
      ["spans", bool, false],
      ["prefetch", bool, false],
      ["data", bool, false],
      ["decline", bool, false],
      ["job", str(128), ""],
      ["volunteer", str(16), ""],
    ],
    sparse: ["data", "decline", "job", "volunteer"],
  },
  task: {
    fields: [
      ["task_id", taskId, REQ],
      ["kind", kind, "train"],
      ["model_version", int(0, I64), REQ],
      ["spec", spec, REQ],
      ["dataset", str(128, { empty: false }), REQ],
      ["shard", int(0, U32), 0],
      ["indices", opt(indices), null],
      ["steps", int(1, 1_000_000_000), 1],
      ["batch", int(1, 1 << 20), 16],
      ["optimizer", scalars(32), {}],
      ["seed", int(0, U64), 0],
      ["deadline", num(0.001, 1e7), 60.0],
      ["base_version", opt(int(0, I64)), null],
      ["model_transfer", opt(str(128, { empty: false })), null],
      ["num_chunks", int(0, 1 << 24), 0],
      ["upload_codec", str(32, { empty: false }), "fp32"],
      ["error_feedback", bool, false],
      ["delta_base", opt(int(0, I64)), null],
      ["teacher_logits", opt(logits), null],
      ["temperature", num(1e-3, 1e3), 4.0],
      ["distill_alpha", num(0, 1), 0.7],
      ["init_seed", opt(int(0, U64)), null],
      ["init_crc", opt(int(0, U32)), null],
      ["data", opt(sha256), null],
      ["init_scheme", opt(str(32, { empty: false })), null],
      ["subnet", opt(indices), null],
      ["boundary", opt(int(1, 65535)), null],
    ],
    sparse: ["data", "init_scheme", "subnet", "boundary"],
    cross: taskCross,
  },
  result: {
    fields: [
      ["task_id", taskId, REQ],
      ["model_version", int(0, I64), REQ],
      ["kind", kind, "train"],
      ["num_chunks", int(0, 1 << 24), 0],
      ["loss", opt(num(-1e300, 1e300, { inf: true })), null],
      ["samples", int(0, I64), 0],
      ["steps", int(0, I64), 0],
      ["compute_seconds", num(0, 1e9), 0.0],
      ["metrics", scalars(64, { numbersOnly: true }), {}],
    ],
  },
  chunk: {
    fields: [
      ["transfer", str(128, { empty: false }), REQ],
      ["seq", int(0, 2 ** 24 - 1), REQ],
      ["total", int(1, 2 ** 24), REQ],
      ["layer", int(0, 65535), REQ],
      ["part", str(64, { empty: false }), REQ],
      ["row_start", int(0, U32 - 1), REQ],
      ["row_end", int(1, U32), REQ],
      ["codec", int(0, 255), 0],
      ["crc", int(0, U32), REQ],
      ["blocks", int(1, MAX_CHUNK_BLOCKS), 1],
      ["payload", bin, REQ],
    ],
    sparse: ["blocks"],
    cross: chunkCross,
  },
  ack: {
    fields: [
      ["task_id", taskId, REQ],
      ["accepted", bool, REQ],
      ["reason", str(64), ""],
    ],
  },
  prefetch: { fields: [["task_id", taskId, REQ]] },
  decline: {
    fields: [
      ["task_id", taskId, REQ],
      ["reason", str(256), ""],
    ],
  },
  heartbeat: {
    fields: [
      ["seq", int(0, I64), REQ],
      ["time", num(-1e15, 1e15), 0.0],
      ["echo", opt(num(-1e15, 1e15)), null],
      ["held", opt(num(0, 1e15)), null],
    ],
    sparse: ["held"],
  },
  error: {
    fields: [
      ["code", int(0, 65535), REQ],
      ["message", str(1024), ""],
    ],
  },
  bye: {
    fields: [
      ["reason", str(256), ""],
      ["detail", str(256), ""],
    ],
    sparse: ["detail"],
  },
  fetch: {
    fields: [
      ["data", sha256, REQ],
      ["offset", int(0, U32), 0],
    ],
  },
  data: {
    fields: [
      ["data", sha256, REQ],
      ["offset", int(0, U32), REQ],
      ["size", int(1, U32), REQ],
      ["payload", bin, REQ],
    ],
    cross: dataCross,
  },
};
/** type -> its sparse keys. */
const SPARSE = new Map(Object.entries(SCHEMAS).map(([type, s]) => [type, new Set(s.sparse ?? [])]));

/** @param {unknown} dflt */
function fresh(dflt) {
  if (Array.isArray(dflt)) return dflt.slice();
  if (isMap(dflt)) return { ...dflt };
  return dflt;
}

/** @param {Schema} schema @param {string} type @param {Record<string, unknown>} obj */
function validate(schema, type, obj) {
  /** @type {Record<string, unknown>} */
  const out = { type };
  for (const [name, check, dflt] of schema.fields) {
    const where = `${type}.${name}`;
    if (Object.hasOwn(obj, name) && obj[name] !== undefined) out[name] = check(obj[name], where);
    else if (dflt === REQ) throw fail(`${where}: missing required field`);
    else out[name] = fresh(dflt);
  }
  schema.cross?.(/** @type {Message} */ (out)); // every field checked: it is one
  return out;
}

// -- encoding ------------------------------------------------------------------------

// useBigInt64 writes BigInts as int64/uint64, but also integral Numbers of 2^32
// and more as float64; int fields are turned into the form that encodes smallest
// (wireInt), so only a float field's integral value takes the float64 path.
const ENCODER = new Encoder({ extensionCodec: EXTENSIONS, useBigInt64: true });

/** @param {unknown} v */
function wireInt(v) {
  if (typeof v === "bigint") return v >= -(2n ** 31n) && v < 2n ** 32n ? Number(v) : v;
  if (typeof v !== "number") throw new TypeError(`wireInt: ${show(v)} is not an int`);
  return v >= 2 ** 32 || v < -(2 ** 31) ? BigInt(v) : v;
}

/** @param {unknown} v @param {unknown} dflt */
function isDefault(v, dflt) {
  if (Array.isArray(dflt)) return Array.isArray(v) && v.length === 0 && dflt.length === 0;
  return v === dflt;
}

/** Plain wire values to one frame, without validation (tests, fake peers). */
/** @param {unknown} obj */
export function encodeRaw(obj) {
  return ENCODER.encode(obj);
}

const PAYLOAD_KEY = ENCODER.encode("payload");

/** @param {number} n */
function binHeader(n) {
  if (n < 2 ** 8) return Uint8Array.of(0xc4, n);
  if (n < 2 ** 16) return Uint8Array.of(0xc5, n >>> 8, n & 0xff);
  return Uint8Array.of(0xc6, n >>> 24, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff);
}

/** A chunk frame as a small header, then the payload copied once (rather than
 *  through the encoder's growing buffer): the same bytes as the generic path. */
/** @param {Record<string, unknown>} wire a chunk's (toWire checked its payload) */
function encodeChunk(wire) {
  const { payload, ...head } = wire;
  if (!(payload instanceof Uint8Array)) throw new TypeError("encodeChunk: the payload is not bytes");
  const h = ENCODER.encode(head);
  h[0] += 1; // a fixmap of 10 (11 with blocks) entries: the payload makes one more
  const hdr = binHeader(payload.length);
  const out = new Uint8Array(h.length + PAYLOAD_KEY.length + hdr.length + payload.length);
  out.set(h, 0);
  out.set(PAYLOAD_KEY, h.length);
  out.set(hdr, h.length + PAYLOAD_KEY.length);
  out.set(payload, h.length + PAYLOAD_KEY.length + hdr.length);
  return out;
}

/** The wire map of a message (validated, defaults filled in, in §3 table order,
 *  sparse keys left off at their default, §10), as encodeMessage writes it.
 *  @param {OutMessage} msg */
export function toWire(msg) {
  const type = msg?.type;
  const schema = typeof type === "string" && Object.hasOwn(SCHEMAS, type) ? SCHEMAS[type] : null;
  if (schema === null) throw new TypeError(`encodeMessage: unknown message type ${show(type)}`);
  let m;
  try {
    m = validate(schema, type, msg);
  } catch (exc) {
    // A bad field of our own message is our bug, not the peer's: never a ProtocolError.
    if (exc instanceof ProtocolError) throw new TypeError(exc.message);
    throw exc;
  }
  const sparse = SPARSE.get(type);
  /** @type {Record<string, unknown>} */
  const wire = { type };
  for (const [name, check, dflt] of schema.fields) {
    const v = m[name];
    if (sparse?.has(name) && isDefault(v, dflt)) continue;
    if (check.isInt && v !== null) wire[name] = wireInt(v);
    else if (name === "limits" && isMap(v)) wire[name] = { ...v, max_message_bytes: wireInt(v.max_message_bytes) };
    else wire[name] = v;
  }
  return wire;
}

/** One message (a plain object with `type` and its wire keys; defaults may be
 *  left out) -> one frame. Written for a client's messages (hello, result, chunk,
 *  prefetch, decline, fetch, heartbeat, bye, error) but takes every type. Integral
 *  floats go out as ints, which every receiver accepts (§1). Throws TypeError for
 *  a field out of its range.
 *  @param {OutMessage} msg */
export function encodeMessage(msg) {
  const wire = toWire(msg);
  return wire.type === "chunk" ? encodeChunk(wire) : ENCODER.encode(wire);
}
