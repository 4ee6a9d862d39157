// CRC-32 (ISO-HDLC, as zlib/gzip/PNG) of chunk payloads and init_crc (§5.4, §12.3).
//
// Slicing-by-8: eight 256-entry tables let the loop consume 8 bytes per step,
// several times the speed of the byte-at-a-time loop on a multi-megabyte model
// chunk. The incremental form continues a previous result exactly like
// zlib.crc32(data, prev), so a model's CRC can be fed layer by layer.

import { asBytes } from "./bytes.js";

const T = new Uint32Array(8 * 256);
for (let n = 0; n < 256; n++) {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  T[n] = c;
}
for (let n = 0; n < 256; n++) {
  let c = T[n];
  for (let t = 1; t < 8; t++) {
    c = T[c & 0xff] ^ (c >>> 8);
    T[t * 256 + n] = c;
  }
}

/** CRC-32 of `data` (Uint8Array or any ArrayBufferView, e.g. a Float32Array's
 *  bytes in platform order: little-endian everywhere a browser runs), continuing
 *  from `prev`, the CRC of the bytes before it (0 to start). Returns a uint32. */
/** @param {ArrayBufferLike | ArrayBufferView} data @returns {number} */
export function crc32(data, prev = 0) {
  const b = asBytes(data);
  const n = b.length;
  let c = ~prev;
  let i = 0;
  for (; i + 8 <= n; i += 8) {
    const lo = (b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24)) ^ c;
    const hi = b[i + 4] | (b[i + 5] << 8) | (b[i + 6] << 16) | (b[i + 7] << 24);
    c =
      T[1792 + (lo & 0xff)] ^
      T[1536 + ((lo >>> 8) & 0xff)] ^
      T[1280 + ((lo >>> 16) & 0xff)] ^
      T[1024 + (lo >>> 24)] ^
      T[768 + (hi & 0xff)] ^
      T[512 + ((hi >>> 8) & 0xff)] ^
      T[256 + ((hi >>> 16) & 0xff)] ^
      T[hi >>> 24];
  }
  for (; i < n; i++) c = T[(c ^ b[i]) & 0xff] ^ (c >>> 8);
  return ~c >>> 0;
}
