// Transfers: a flat Float32Array in a layout <-> chunk messages (§5, §11.2).
//
// A layout is spec.js's paramsLayout(widths) (or namedLayout for other arrays):
// blocks {layer, part, rows, cols, offset, size}, cols 0 for a 1-D block. A chunk
// carries whole rows of one block, or with spans (both peers said so) the tail of
// one block, whole blocks, and the head of another, each piece encoded alone.
//
// The upload plan mirrors the reference's (protocol/chunking.py) exactly, because
// error feedback keys its residuals by the pieces' rows (§11.2): the same plan
// must come out for every result of a session, and the reference's plan is what
// the conformance vectors pin.

import { concatBytes } from "./bytes.js";
import { crc32 } from "./crc32.js";
import { encodePiece, decodePiece, encodedSize, isKnownWireId, parseCodec, pieceSize, Residuals } from "./codecs.js";
import { ErrorCode, ProtocolError } from "./errors.js";
import { encodeRaw, MAX_CHUNK_BLOCKS } from "./wire.js";

/** @typedef {import("./spec.js").Block} Block */
/** @typedef {import("./codecs.js").Codec} Codec */
/** @typedef {import("./codecs.js").WordSource} WordSource */
/** @typedef {import("./wire.js").Chunk} Chunk */
/** A chunk's piece of one block: rows [rowStart, rowEnd).
 *  @typedef {{block: Block, rowStart: number, rowEnd: number}} Piece */

/** Most chunks one transfer may have (chunk.total, §3.5). */
export const MAX_CHUNKS = 1 << 24;
/** Smallest preferred frame (§8): below it the envelope starts to dominate. */
export const MIN_FRAME_BYTES = 4096;

/** The frame size a chunk sender aims for on a link (§8): one burst of it,
 *  within the frame limit; the whole limit when the rate is unlimited (null). */
/** @param {{bytes_per_s: number | null, max_message_bytes: number, burst?: number}} limits */
export function frameBytes(limits) {
  const { bytes_per_s: bps, max_message_bytes: max, burst = 1 } = limits;
  if (bps === null || bps === Infinity) return max;
  return Math.min(max, Math.max(MIN_FRAME_BYTES, Math.floor(burst * bps)));
}

/** A layout for named arrays [{name, rows, cols}] (§5.2): block i is (i, name). */
/** @param {{name: string, rows: number, cols?: number}[]} arrays @returns {Block[]} */
export function namedLayout(arrays) {
  let offset = 0;
  return arrays.map(({ name, rows, cols = 0 }, i) => {
    const size = rows * (cols || 1);
    const block = { layer: i, part: name, rows, cols, offset, size };
    offset += size;
    return block;
  });
}

/** The codec's view of rows [r0, r1) of a block: rows = 1 for a 1-D piece. */
/** @param {Block} block @param {number} r0 @param {number} r1 */
function pieceDims(block, r0, r1) {
  const w = block.cols || 1;
  return { rows: block.cols ? r1 - r0 : 1, n: (r1 - r0) * w, offset: block.offset + r0 * w };
}

/** @param {Codec} codec @param {Block} block @param {number} r0 @param {number} r1 */
function sizeOf(codec, block, r0, r1) {
  const { rows, n } = pieceDims(block, r0, r1);
  return encodedSize(codec, rows, n);
}

/** @type {Map<string, number>} */
const OVERHEAD = new Map();
const utf8 = new TextEncoder();

/** Worst-case frame bytes of a chunk besides its payload: every int at its
 *  maximum, the `blocks` key when the chunk spans, and a bin32 header. Only the
 *  lengths of `transfer` and `part` matter (msgpack sizes a str by its length). */
/** @param {number} transferBytes @param {string} part @param {boolean} spans */
function overhead(transferBytes, part, spans) {
  const key = `${transferBytes}\u0000${part}\u0000${spans}`;
  let size = OVERHEAD.get(key);
  if (size === undefined) {
    const probe = {
      type: "chunk",
      transfer: "x".repeat(transferBytes),
      seq: 2 ** 24 - 2,
      total: 2 ** 24 - 1,
      layer: 65535,
      part,
      row_start: 2 ** 32 - 2,
      row_end: 2 ** 32 - 1,
      codec: 255,
      crc: 2 ** 32 - 1,
      ...(spans ? { blocks: MAX_CHUNK_BLOCKS } : {}),
      payload: new Uint8Array(0),
    };
    size = encodeRaw(probe).length - 2 + 5; // an empty bin8 header -> the worst, bin32
    if (OVERHEAD.size < 1024) OVERHEAD.set(key, size);
  }
  return size;
}

/** The most rows of `block` from r0 whose encoding fits `budget` (may be 0). */
/** @param {Codec} codec @param {Block} block @param {number} r0 @param {number} budget */
function rowsFitting(codec, block, r0, budget) {
  let lo = 0;
  let hi = block.rows - r0;
  if (sizeOf(codec, block, r0, r0 + hi) <= budget) return hi;
  while (lo < hi) {
    const mid = (lo + hi + 1) >>> 1;
    if (sizeOf(codec, block, r0, r0 + mid) <= budget) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/** The chunks of a transfer, in send order, each as the pieces it carries:
 *  [[{block, rowStart, rowEnd}, ...], ...]. Each frame is filled to `frameBytes`
 *  (a row larger than that goes alone) and never passes `maxMessageBytes`, the
 *  envelope included; with `spans` a chunk with room left goes on into the next
 *  blocks. `transfer` is the transfer id (its length is part of the envelope).
 *  Throws RangeError when one row of a block cannot fit `maxMessageBytes`: a
 *  configuration error to report before anything is sent (§5.3 rule 2).
 *  @param {Block[]} layout
 *  @param {string | Codec} codec
 *  @param {number | null | undefined} frameBytes
 *  @param {number} maxMessageBytes
 *  @param {{spans?: boolean, transfer?: string}} [options]
 *  @returns {Piece[][]} */
export function planChunks(layout, codec, frameBytes, maxMessageBytes, { spans = false, transfer } = {}) {
  const c = typeof codec === "string" ? parseCodec(codec) : codec;
  if (typeof transfer !== "string") throw new TypeError("planChunks: {transfer} (the transfer id) is required");
  const tb = utf8.encode(transfer).length;
  // A target at or above the hard limit changes nothing.
  const target = frameBytes == null || frameBytes >= maxMessageBytes ? null : frameBytes;
  const oneRows = layout.map((b) => sizeOf(c, b, 0, 1));
  layout.forEach((b, i) => {
    const budget = maxMessageBytes - overhead(tb, b.part, false);
    if (oneRows[i] > budget) {
      throw new RangeError(
        `block (${b.layer}, '${b.part}'): one row encodes to ${oneRows[i]} bytes with codec ${c.name}, ` +
          `more than the ${budget} payload bytes a ${maxMessageBytes}-byte frame allows; ` +
          "raise max_message_bytes or use a smaller codec",
      );
    }
  });
  /** @type {Piece[][]} */
  const plan = [];
  let i = 0;
  let r0 = 0;
  while (i < layout.length) {
    const blk = layout[i];
    const over = overhead(tb, blk.part, false);
    let budget = maxMessageBytes - over;
    if (target !== null) budget = Math.min(budget, Math.max(oneRows[i], target - over));
    let n = Math.max(1, rowsFitting(c, blk, r0, budget));
    const span = [{ block: blk, rowStart: r0, rowEnd: r0 + n }];
    budget -= sizeOf(c, blk, r0, r0 + n);
    r0 += n;
    if (r0 === blk.rows) {
      i += 1;
      r0 = 0;
      // Going on costs the `blocks` key, so a chunk that stays in its block is
      // planned exactly as without spans, and spans never need more chunks.
      if (spans) budget -= overhead(tb, blk.part, true) - over;
      while (spans && i < layout.length && span.length < MAX_CHUNK_BLOCKS) {
        const next = layout[i];
        n = rowsFitting(c, next, 0, budget);
        if (n === 0) break;
        span.push({ block: next, rowStart: 0, rowEnd: n });
        budget -= sizeOf(c, next, 0, n);
        if (n < next.rows) {
          r0 = n;
          break;
        }
        i += 1;
      }
    }
    plan.push(span);
  }
  if (plan.length > MAX_CHUNKS) throw new RangeError(`transfer '${transfer}': ${plan.length} chunks, more than 2^24`);
  return plan;
}

/** `flat` (Float32Array in `layout` order) as chunk messages, ready for
 *  encodeMessage, planned as planChunks does (frameBytes defaults to
 *  maxMessageBytes). With `residuals` (a codecs.Residuals; one bound to another
 *  codec starts afresh with this one) every piece goes through error feedback, keyed by its (layer, part, rowStart,
 *  rowEnd). `rand` ({nextU32()}, the task's G(seed, 1)) feeds the -sr codecs, one
 *  word per value in chunk seq order, then piece order (§11.1).
 *  @param {Float32Array} flat
 *  @param {Block[]} layout
 *  @param {{transfer: string, codec?: string | Codec, frameBytes?: number | null, maxMessageBytes: number,
 *    spans?: boolean, residuals?: Residuals | null, rand?: WordSource | null}} options
 *  @returns {Chunk[]} */
export function encodeTransfer(flat, layout, {
  transfer, codec = "fp32", frameBytes: fb = null, maxMessageBytes, spans = false, residuals = null, rand = null,
}) {
  const c = typeof codec === "string" ? parseCodec(codec) : codec;
  if (residuals !== null) residuals.useCodec(c);
  const last = layout[layout.length - 1];
  if (!(flat instanceof Float32Array) || flat.length !== last.offset + last.size) {
    throw new TypeError(`encodeTransfer: expected a Float32Array of ${last.offset + last.size} values`);
  }
  const plan = planChunks(layout, c, fb ?? maxMessageBytes, maxMessageBytes, { spans, transfer });
  return plan.map((span, seq) => {
    const parts = span.map(({ block, rowStart, rowEnd }) => {
      const { rows, n, offset } = pieceDims(block, rowStart, rowEnd);
      const x = flat.subarray(offset, offset + n);
      return residuals !== null
        ? residuals.encode(Residuals.key(block.layer, block.part, rowStart, rowEnd), x, rows, { rand })
        : encodePiece(c, x, rows, { rand });
    });
    const payload = concatBytes(parts);
    const first = span[0];
    return {
      type: "chunk",
      transfer,
      seq,
      total: plan.length,
      layer: first.block.layer,
      part: first.block.part,
      row_start: first.rowStart,
      row_end: span[span.length - 1].rowEnd,
      codec: c.id,
      crc: crc32(payload),
      blocks: span.length,
      payload,
    };
  });
}

/** @param {number} layer @param {string} part */
function blockKey(layer, part) {
  return `${layer}\u0000${part}`;
}

/** Collects one transfer's chunks, in any order, into a flat Float32Array.
 *  accept() refuses, with the §5.3 table's ProtocolError, any chunk that does
 *  not fit, and leaves the transfer exactly as it was when it does. */
export class Reassembler {
  /** Block index by (layer, part). @type {Map<string, number>} */
  #index;
  /** Per block, 1 for each row received. @type {Uint8Array[]} */
  #have;
  /** Seqs accepted. @type {Set<number>} */
  #seqs = new Set();
  #rowsTotal;
  #rowsLeft;
  /** The values, filled in place. @type {Float32Array} */
  #out;

  /** @param {Block[]} layout paramsLayout(widths) or namedLayout(...)
   *  @param {{transfer: string, total?: number | null, expectCodec?: number | null, out?: Float32Array | null}} options
   *  transfer: the announced transfer id (task.model_transfer, or task_id);
   *  total: the announced chunk count (num_chunks), null: the first chunk's;
   *  expectCodec: the wire id every chunk must carry (a result's upload
   *  codec), or null for any known codec;
   *  out: a Float32Array to fill in place (rows not yet received keep
   *  their values), default a fresh zeroed one */
  constructor(layout, { transfer, total = null, expectCodec = null, out = null }) {
    this.layout = layout;
    this.transfer = transfer;
    this.total = total;
    this.expectCodec = expectCodec;
    this.#index = new Map(layout.map((b, i) => [blockKey(b.layer, b.part), i]));
    this.#have = layout.map((b) => new Uint8Array(b.rows)); // 1 = row received
    this.#rowsTotal = layout.reduce((s, b) => s + b.rows, 0);
    this.#rowsLeft = this.#rowsTotal;
    const size = layout.length ? layout[layout.length - 1].offset + layout[layout.length - 1].size : 0;
    if (out !== null && out.length !== size) throw new TypeError(`Reassembler: out must hold ${size} values`);
    this.#out = out ?? new Float32Array(size);
    if (total !== null && !(Number.isInteger(total) && total >= 1 && total <= this.#rowsTotal)) {
      // `total` comes from the peer's task or result: its fault. Every chunk
      // carries at least one row, so more chunks than rows cannot be right.
      throw new ProtocolError(ErrorCode.BAD_FIELD, `num_chunks: ${total} outside 1..${this.#rowsTotal} (rows of the layout)`);
    }
  }

  /** Validate and place one chunk message (as decodeFrame returns it).
   *  @param {Chunk} chunk */
  accept(chunk) {
    const where = `chunk ${chunk.seq} of '${chunk.transfer}'`;
    /** @param {number} code @param {string} why */
    const refuse = (code, why) => new ProtocolError(code, `${where}: ${why}`);
    if (chunk.transfer !== this.transfer) {
      throw new ProtocolError(ErrorCode.UNKNOWN_TASK, `${where}: expected transfer '${this.transfer}'`);
    }
    const total = this.total ?? chunk.total;
    if (chunk.total !== total || total > this.#rowsTotal) {
      throw refuse(ErrorCode.BAD_CHUNK, `total ${chunk.total}, expected ${this.total ?? `<= ${this.#rowsTotal}`}`);
    }
    if (!(Number.isInteger(chunk.seq) && chunk.seq >= 0 && chunk.seq < total)) {
      throw refuse(ErrorCode.BAD_CHUNK, `seq outside 0..${total - 1}`);
    }
    if (this.#seqs.has(chunk.seq)) throw new ProtocolError(ErrorCode.DUPLICATE, `${where}: seq received twice`);
    const first = this.#index.get(blockKey(chunk.layer, chunk.part));
    if (first === undefined) throw refuse(ErrorCode.BAD_CHUNK, `no block (layer ${chunk.layer}, '${chunk.part}')`);
    const k = chunk.blocks ?? 1;
    if (!(Number.isInteger(k) && k >= 1 && first + k <= this.layout.length)) {
      throw refuse(
        ErrorCode.BAD_CHUNK,
        `spans ${k} blocks from (${chunk.layer}, '${chunk.part}'), the layout has ${this.layout.length - first} from there`,
      );
    }
    const pieces = [];
    for (let j = 0; j < k; j++) {
      const block = this.layout[first + j];
      const r0 = j === 0 ? chunk.row_start : 0;
      const r1 = j === k - 1 ? chunk.row_end : block.rows;
      if (!(r1 <= block.rows && r0 < r1)) {
        throw refuse(
          ErrorCode.BAD_CHUNK,
          `rows [${r0}, ${r1}) out of range for block (${block.layer}, '${block.part}') with ${block.rows} rows`,
        );
      }
      if (this.#have[first + j].subarray(r0, r1).includes(1)) {
        throw new ProtocolError(
          ErrorCode.CONFLICT,
          `${where}: rows [${r0}, ${r1}) of block (${block.layer}, '${block.part}') overlap rows already received`,
        );
      }
      pieces.push({ index: first + j, block, r0, r1, ...pieceDims(block, r0, r1) });
    }
    const codec = chunk.codec ?? 0;
    if (!isKnownWireId(codec)) throw refuse(ErrorCode.BAD_CHUNK, `unknown codec id ${codec}`);
    if (this.expectCodec !== null && codec !== this.expectCodec) {
      throw refuse(ErrorCode.BAD_CHUNK, `codec id ${codec}, the task's upload codec is ${this.expectCodec}`);
    }
    const payload = chunk.payload;
    if (crc32(payload) !== chunk.crc) throw new ProtocolError(ErrorCode.CHECKSUM, `${where}: crc32 mismatch`);
    let values;
    try {
      let slices = [payload];
      if (k > 1) {
        // Split at each piece's size (top-k's comes from its count header).
        slices = [];
        let at = 0;
        for (const p of pieces) {
          if (at > payload.length) break;
          const size = pieceSize(codec, payload.subarray(at), p.rows, p.n);
          slices.push(payload.subarray(at, at + size));
          at += size;
        }
        if (at !== payload.length) {
          throw new ProtocolError(
            ErrorCode.BAD_CHUNK,
            `payload of ${payload.length} bytes, its ${k} pieces encode to ${at} or more`,
          );
        }
      }
      values = pieces.map((p, j) => decodePiece(codec, slices[j], p.rows, p.n));
    } catch (exc) {
      if (exc instanceof ProtocolError) throw refuse(exc.code, exc.message);
      throw exc;
    }
    // Everything checked: only now does the transfer change.
    pieces.forEach((p, j) => {
      this.#out.set(values[j], p.offset);
      this.#have[p.index].fill(1, p.r0, p.r1);
      this.#rowsLeft -= p.r1 - p.r0;
    });
    this.#seqs.add(chunk.seq);
    this.total = total;
  }

  /** Chunks accepted so far. */
  get received() {
    return this.#seqs.size;
  }

  /** All `total` chunks arrived and every row is covered. */
  get complete() {
    return this.#rowsLeft === 0 && this.total !== null && this.#seqs.size === this.total;
  }

  /** Row ranges not yet received: [{layer, part, rowStart, rowEnd}]. */
  missing() {
    /** @type {{layer: number, part: string, rowStart: number, rowEnd: number}[]} */
    const out = [];
    this.layout.forEach((b, i) => {
      const have = this.#have[i];
      let r = 0;
      while (r < b.rows) {
        const start = have.indexOf(0, r);
        if (start < 0) break;
        let end = have.indexOf(1, start);
        if (end < 0) end = b.rows;
        out.push({ layer: b.layer, part: b.part, rowStart: start, rowEnd: end });
        r = end;
      }
    });
    return out;
  }

  /** Sequence numbers not yet received (empty while `total` is unknown). */
  missingSeqs() {
    const out = [];
    for (let s = 0; this.total !== null && s < this.total; s++) if (!this.#seqs.has(s)) out.push(s);
    return out;
  }

  /** The reassembled values in layout order; only once `complete`. */
  result() {
    if (!this.complete) {
      throw new Error(
        `transfer '${this.transfer}' is not complete: missing ${JSON.stringify(this.missing().slice(0, 5))} ` +
          `seqs ${this.missingSeqs().slice(0, 5)}`,
      );
    }
    return this.#out;
  }
}
