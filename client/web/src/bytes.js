// Little-endian arrays in and out of byte strings (docs/protocol.md §1, §4).
//
// Every array inside a frame (chunk payloads, ndarray data, shard files) starts
// at whatever byte offset msgpack put it, so a typed-array view on the frame
// would throw for an unaligned offset. These helpers always copy, which also
// detaches the result from the frame's buffer. The payloads are little-endian;
// a (hypothetical) big-endian platform goes through a DataView instead.

export const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** The typed arrays that go on the wire: elements of 1, 2 or 4 bytes.
 *  @typedef {Uint8Array | Int8Array | Uint16Array | Int32Array | Uint32Array | Float32Array} WireArray */

/** @typedef {"getFloat32" | "getUint32" | "getInt32" | "getUint16"} Getter */
/** @typedef {"setFloat32" | "setUint32" | "setInt32" | "setUint16"} Setter */

/** @type {Map<Function, Getter>} */
const GETTERS = new Map(/** @type {[Function, Getter][]} */ ([
  [Float32Array, "getFloat32"],
  [Uint32Array, "getUint32"],
  [Int32Array, "getInt32"],
  [Uint16Array, "getUint16"],
]));
/** @type {Map<Function, Setter>} */
const SETTERS = new Map(/** @type {[Function, Setter][]} */ ([
  [Float32Array, "setFloat32"],
  [Uint32Array, "setUint32"],
  [Int32Array, "setInt32"],
  [Uint16Array, "setUint16"],
]));

/** A Uint8Array over the bytes of any ArrayBuffer or ArrayBufferView (no copy).
 *  @param {ArrayBufferLike | ArrayBufferView} data
 *  @returns {Uint8Array} */
export function asBytes(data) {
  if (data instanceof Uint8Array) return data;
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  throw new TypeError(`expected bytes, got ${Object.prototype.toString.call(data)}`);
}

/** `n` little-endian elements of typed-array class `Ctor` from `bytes` at `offset`,
 *  copied into a fresh (aligned) array. The caller has checked the length.
 *  @template {Float32Array | Uint32Array | Int32Array | Uint16Array | Uint8Array | Int8Array} T
 *  @param {{new (buffer: ArrayBuffer): T, new (length: number): T, readonly BYTES_PER_ELEMENT: number}} Ctor
 *  @param {Uint8Array} bytes
 *  @param {number} offset
 *  @param {number} n
 *  @returns {T} */
export function readLE(Ctor, bytes, offset, n) {
  const size = Ctor.BYTES_PER_ELEMENT;
  if (size === 1 || LITTLE_ENDIAN) {
    return new Ctor(bytes.slice(offset, offset + n * size).buffer);
  }
  const out = new Ctor(n);
  const view = new DataView(bytes.buffer, bytes.byteOffset + offset, n * size);
  const get = GETTERS.get(Ctor);
  if (get === undefined) throw new TypeError(`readLE: no little-endian reader for ${Ctor}`);
  for (let i = 0; i < n; i++) out[i] = view[get](i * size, true);
  return out;
}

/** The little-endian bytes of a typed array (a copy).
 *  @param {WireArray} arr
 *  @returns {Uint8Array} */
export function bytesLE(arr) {
  const size = arr.BYTES_PER_ELEMENT;
  if (size === 1 || LITTLE_ENDIAN) {
    return new Uint8Array(arr.buffer.slice(arr.byteOffset, arr.byteOffset + arr.byteLength));
  }
  const out = new Uint8Array(arr.byteLength);
  const view = new DataView(out.buffer);
  const set = SETTERS.get(arr.constructor);
  if (set === undefined) throw new TypeError(`bytesLE: no little-endian writer for ${arr.constructor.name}`);
  for (let i = 0; i < arr.length; i++) view[set](i * size, arr[i], true);
  return out;
}

/** One byte string from several (a spanning chunk's pieces, §5.3).
 *  @param {Uint8Array[]} parts
 *  @returns {Uint8Array} */
export function concatBytes(parts) {
  if (parts.length === 1) return parts[0];
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

const HEX = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, "0"));

/** @param {ArrayBufferLike | ArrayBufferView} bytes */
export function toHex(bytes) {
  const b = asBytes(bytes);
  let s = "";
  for (let i = 0; i < b.length; i++) s += HEX[b[i]];
  return s;
}

/** @param {string} text */
export function fromHex(text) {
  if (text.length % 2 || /[^0-9a-fA-F]/.test(text)) throw new TypeError("fromHex: not hex");
  const out = new Uint8Array(text.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(text.substr(2 * i, 2), 16);
  return out;
}
