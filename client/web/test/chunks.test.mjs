import { test } from "node:test";
import assert from "node:assert/strict";
import { Reassembler, encodeTransfer, frameBytes, namedLayout, planChunks } from "../src/chunks.js";
import { Residuals, decodePiece, encodePiece, parseCodec } from "../src/codecs.js";
import { crc32 } from "../src/crc32.js";
import { fromHex } from "../src/bytes.js";
import { ProtocolError, errorName } from "../src/errors.js";
import { paramsLayout } from "../src/spec.js";
import { decodeFrame, encodeMessage } from "../src/wire.js";
import { Xoshiro, computeJson, vectorBytes, vectorJson } from "./helpers.mjs";

function rejects(fn, code, text) {
  assert.throws(fn, (err) => {
    assert.ok(err instanceof ProtocolError, `expected ProtocolError, got ${err}`);
    assert.equal(errorName(err.code), code, err.message);
    if (text !== undefined) assert.ok(err.message.includes(text), `"${err.message}" lacks "${text}"`);
    return true;
  });
}

function shuffled(a, g) {
  const out = a.slice();
  for (let i = out.length - 1; i > 0; i--) {
    const j = g.nextU32() % (i + 1);
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

function randomModel(widths, g, scale = 1) {
  const layout = paramsLayout(widths);
  const last = layout[layout.length - 1];
  const flat = Float32Array.from({ length: last.offset + last.size }, () => (g.nextU32() / 2 ** 32 - 0.5) * scale);
  return { layout, flat };
}

// -- CRC-32 (§5.4) ------------------------------------------------------------------

test("crc32: check value, incremental form, typed arrays", () => {
  const ascii = new TextEncoder().encode("123456789");
  assert.equal(crc32(ascii), 0xcbf43926);
  assert.equal(crc32(new Uint8Array(0)), 0);
  assert.equal(crc32(ascii.subarray(5), crc32(ascii.subarray(0, 5))), 0xcbf43926);
  const g = new Xoshiro(1, 0);
  const big = Uint8Array.from({ length: 1000 }, () => g.nextU32() & 0xff);
  let c = 0;
  for (let at = 0; at < big.length; at += 37) c = crc32(big.subarray(at, at + 37), c);
  assert.equal(c, crc32(big));
  const f = Float32Array.of(1.5, -2, 3);
  assert.equal(crc32(f), crc32(new Uint8Array(f.buffer)));
});

test("crc32: the vectors' chunk CRCs and init.json's parameter CRC", () => {
  for (const name of vectorJson("transfer_tiny").frames) {
    const c = decodeFrame(vectorBytes(name));
    assert.equal(crc32(c.payload), c.crc, name);
  }
  const { whole } = computeJson("init");
  const params = Float32Array.from(whole.params);
  assert.equal(crc32(params), whole.crc32);
  // fed a layer at a time, as a client checks init_crc of a model too large to copy
  assert.equal(crc32(params.subarray(7), crc32(params.subarray(0, 7))), whole.crc32);
});

// -- the vectors: transfer_tiny, transfer_tiny_spans (§10) --------------------------------

for (const name of ["transfer_tiny", "transfer_tiny_spans", "transfer_tiny_int8", "transfer_tiny_int4"]) {
  const doc = vectorJson(name);
  const layout = paramsLayout(doc.spec.widths);
  const codec = doc.codec;
  // what the receiver holds: the parameters (fp32), or each piece decoded (§11)
  const want = fromHex((doc.decoded_le_f32 ?? doc.params_le_f32).$bin);
  const source = fromHex(doc.params_le_f32.$bin);
  const frames = doc.frames.map(vectorBytes);
  const spans = name.endsWith("spans");

  test(`${name}: the frames reassemble to params_le_f32, in any order`, () => {
    for (const seed of [0, 1, 2]) {
      const r = new Reassembler(layout, { transfer: "model-3", total: frames.length });
      const order = seed === 0 ? frames : shuffled(frames, new Xoshiro(seed, 0));
      for (const f of order) {
        assert.equal(r.complete, false);
        r.accept(decodeFrame(f, doc.max_message_bytes));
      }
      assert.equal(r.complete, true);
      assert.deepStrictEqual(new Uint8Array(r.result().buffer), want);
    }
  });

  test(`${name}: planning reproduces the vector's chunk boundaries and bytes`, () => {
    const mmb = doc.max_message_bytes;
    const plan = planChunks(layout, codec, mmb, mmb, { spans, transfer: "model-3" });
    const got = plan.map((span) => [
      span[0].block.layer, span[0].block.part, span[0].rowStart, span.at(-1).rowEnd, span.length,
    ]);
    const expected = frames.map((f) => {
      const c = decodeFrame(f);
      return [c.layer, c.part, c.row_start, c.row_end, c.blocks];
    });
    assert.deepStrictEqual(got, expected);
    const flat = new Float32Array(source.slice().buffer);
    const chunks = encodeTransfer(flat, layout, { transfer: "model-3", codec, maxMessageBytes: mmb, spans });
    assert.deepStrictEqual(chunks.map(encodeMessage), frames);
    for (const f of frames) assert.ok(f.length <= mmb);
  });
}

test("int8 and int4 transfers: a bias block is one row, so one scale for the piece (§11)", () => {
  for (const codec of ["int8", "int4"]) {
    const doc = vectorJson(`transfer_tiny_${codec}`);
    let biases = 0;
    for (const name of doc.frames) {
      const c = decodeFrame(vectorBytes(name));
      const rows = c.row_end - c.row_start;
      const n = c.part === "W" ? rows * doc.spec.widths[c.layer] : rows;
      const scales = c.part === "W" ? rows : 1;
      assert.equal(c.payload.length, 4 * scales + (codec === "int8" ? n : Math.ceil(n / 2)), name);
      if (c.part === "b") biases++;
    }
    assert.equal(biases, doc.spec.widths.length - 1);
  }
});

// -- planning --------------------------------------------------------------------------

test("frameBytes is one burst of the link within the frame limit (§8)", () => {
  assert.equal(frameBytes({ bytes_per_s: 50000, messages_per_s: 30, max_message_bytes: 16 << 20, burst: 1 }), 50000);
  assert.equal(frameBytes({ bytes_per_s: 250000, messages_per_s: 20, max_message_bytes: 1 << 20, burst: 1 }), 250000);
  assert.equal(frameBytes({ bytes_per_s: 125e6, messages_per_s: 1e4, max_message_bytes: 64 << 20, burst: 1 }), 64 << 20);
  assert.equal(frameBytes({ bytes_per_s: null, messages_per_s: null, max_message_bytes: 256 << 20 }), 256 << 20);
  assert.equal(frameBytes({ bytes_per_s: 100, messages_per_s: 1, max_message_bytes: 1 << 20, burst: 1 }), 4096);
});

test("frames stay within frame_bytes (a lone large row excepted) and never pass the limit", () => {
  const g = new Xoshiro(4, 0);
  const { layout, flat } = randomModel([10, 64, 64, 10], g);
  for (const codec of ["fp32", "fp16", "int8", "int4-chunk", "topk:0.1", "topk:0.1+int8"]) {
    for (const spans of [false, true]) {
      for (const [fb, mmb] of [[1024, 4096], [4096, 1 << 20], [300, 1024]]) {
        const chunks = encodeTransfer(flat, layout, { transfer: "t-9", codec, frameBytes: fb, maxMessageBytes: mmb, spans });
        for (const c of chunks) {
          const n = encodeMessage(c).length;
          assert.ok(n <= mmb, `${codec} frame of ${n} > ${mmb}`);
          const oneRow = c.blocks === 1 && (c.row_end - c.row_start === 1);
          assert.ok(n <= fb || oneRow, `${codec} spans=${spans}: frame of ${n} > frame_bytes ${fb}`);
        }
        // spans never need more chunks
        if (spans) {
          const plain = planChunks(layout, codec, fb, mmb, { transfer: "t-9" });
          assert.ok(chunks.length <= plain.length);
        }
      }
    }
  }
});

test("spans pack a small model into one frame each way", () => {
  const { layout, flat } = randomModel([5, 5, 5, 5, 3], new Xoshiro(5, 0));
  assert.equal(encodeTransfer(flat, layout, { transfer: "t", maxMessageBytes: 1 << 20, spans: true }).length, 1);
  assert.equal(encodeTransfer(flat, layout, { transfer: "t", maxMessageBytes: 1 << 20 }).length, 8);
});

test("a row that cannot fit the frame limit is a RangeError before anything is sent", () => {
  const layout = paramsLayout([400, 2]);
  assert.throws(() => planChunks(layout, "fp32", 1024, 1024, { transfer: "t" }), RangeError);
  assert.equal(planChunks(layout, "int8", 1024, 1024, { transfer: "t" }).length, 2); // 404-byte rows: W, then b
  assert.throws(() => planChunks(layout, "fp32", 1024, 1024, {}), TypeError); // the transfer id is needed
});

test("a longer transfer id leaves less room (the envelope is counted)", () => {
  const layout = paramsLayout([5, 5, 5, 5, 3]);
  const short = planChunks(layout, "fp32", 300, 300, { spans: true, transfer: "t" });
  const long = planChunks(layout, "fp32", 300, 300, { spans: true, transfer: "t".repeat(128) });
  assert.ok(long.length > short.length);
});

// -- round trips ---------------------------------------------------------------------------

const ALL_CODECS = ["fp32", "fp16", "int8", "int4", "int8-chunk", "int4-chunk", "topk:0.2", "topk:0.2+int8",
  "int8-sr", "int4-sr", "int8-chunk-sr", "int4-chunk-sr", "topk:0.2+int8-sr"];

for (const codec of ALL_CODECS) {
  for (const spans of [false, true]) {
    test(`round trip: ${codec}, spans ${spans}: each piece decodes as its codec says`, () => {
      const g = new Xoshiro(6, 0);
      const { layout, flat } = randomModel([7, 12, 9, 4], g, 4);
      const c = parseCodec(codec);
      const opts = { transfer: "t-1", codec, frameBytes: 200, maxMessageBytes: 2048, spans };
      const chunks = encodeTransfer(flat, layout, { ...opts, rand: c.stochastic ? new Xoshiro(9, 1) : null });
      // through the wire and back, in a shuffled order
      const r = new Reassembler(layout, { transfer: "t-1", total: chunks.length, expectCodec: c.id });
      for (const ch of shuffled(chunks, g)) r.accept(decodeFrame(encodeMessage(ch), 2048));
      assert.ok(r.complete);
      // what each planned piece should decode to, words drawn in seq then piece order
      const want = new Float32Array(flat.length);
      const rand = c.stochastic ? new Xoshiro(9, 1) : null;
      for (const span of planChunks(layout, c, 200, 2048, { spans, transfer: "t-1" })) {
        for (const { block, rowStart, rowEnd } of span) {
          const w = block.cols || 1;
          const rows = block.cols ? rowEnd - rowStart : 1;
          const at = block.offset + rowStart * w;
          const x = flat.subarray(at, at + (rowEnd - rowStart) * w);
          want.set(decodePiece(c.id, encodePiece(c, x, rows, { rand }), rows, x.length), at);
        }
      }
      assert.deepStrictEqual(r.result(), want);
      if (c.lossless) assert.deepStrictEqual(r.result(), flat);
    });
  }
}

test("error feedback through transfers: residuals keyed by each piece's rows", () => {
  const g = new Xoshiro(7, 0);
  const layout = paramsLayout([6, 10, 3]);
  const res = new Residuals();
  const opts = { transfer: "t", codec: "topk:0.1", frameBytes: 120, maxMessageBytes: 1024, spans: true, residuals: res };
  const size = 6 * 10 + 10 + 10 * 3 + 3;
  const total = new Float64Array(size);
  const sent = new Float64Array(size);
  let keys = null;
  for (let round = 0; round < 3; round++) {
    const { flat } = randomModel([6, 10, 3], g);
    flat.forEach((v, i) => (total[i] += v));
    const chunks = encodeTransfer(flat, layout, opts);
    const r = new Reassembler(layout, { transfer: "t", total: chunks.length, expectCodec: 4 });
    chunks.forEach((c) => r.accept(c));
    r.result().forEach((v, i) => (sent[i] += v));
    const now = res.keys().sort();
    if (keys) assert.deepStrictEqual(now, keys); // the same keys recur every result
    keys = now;
  }
  // what was sent plus what is still owed is what was meant
  const owed = new Float64Array(size);
  for (const span of planChunks(layout, "topk:0.1", 120, 1024, { spans: true, transfer: "t" })) {
    for (const { block, rowStart, rowEnd } of span) {
      const r = res.residual(Residuals.key(block.layer, block.part, rowStart, rowEnd));
      const w = block.cols || 1;
      r.forEach((v, i) => (owed[block.offset + rowStart * w + i] = v));
    }
  }
  for (let i = 0; i < size; i++) assert.ok(Math.abs(sent[i] + owed[i] - total[i]) < 1e-5, `value ${i}`);
  // a new upload codec starts afresh
  encodeTransfer(new Float32Array(size), layout, { ...opts, codec: "int8" });
  assert.ok(res.keys().length > 0);
  assert.equal(res.codec.name, "int8");
});

test("named layouts: blocks (i, name) in order", () => {
  const layout = namedLayout([{ name: "m", rows: 3, cols: 2 }, { name: "v", rows: 4 }]);
  assert.deepStrictEqual(layout.map((b) => [b.layer, b.part, b.offset, b.size]), [[0, "m", 0, 6], [1, "v", 6, 4]]);
  const flat = Float32Array.from({ length: 10 }, (_, i) => i);
  const chunks = encodeTransfer(flat, layout, { transfer: "opt", maxMessageBytes: 1024, spans: true });
  const r = new Reassembler(layout, { transfer: "opt", total: chunks.length });
  chunks.forEach((c) => r.accept(c));
  assert.deepStrictEqual(r.result(), flat);
});

// -- every rejection of the §5.3 table ---------------------------------------------------

function fixture() {
  const { layout, flat } = randomModel([5, 5, 5, 5, 3], new Xoshiro(8, 0));
  // spans at 300 bytes: three frames, two of them starting inside a block
  const chunks = encodeTransfer(flat, layout, { transfer: "model-3", maxMessageBytes: 300, spans: true });
  const fresh = (opts = {}) => new Reassembler(layout, { transfer: "model-3", total: chunks.length, ...opts });
  return { layout, flat, chunks, fresh };
}

/** The chunk with new fields; a new payload gets its CRC unless `crc` is given. */
function edit(chunk, over) {
  const c = { ...chunk, ...over };
  if ("payload" in over && !("crc" in over)) c.crc = crc32(c.payload);
  return c;
}

test("§5.3: every refusal has its code, and leaves the transfer as it was", () => {
  const { layout, flat, chunks, fresh } = fixture();
  assert.equal(chunks.length, 3);
  const [c0, c1, c2] = chunks;
  assert.ok(c1.blocks > 1 && c1.row_start > 0);
  const values = new Float32Array(flat.length); // the buffer the reassembler fills
  const r = fresh({ out: values });
  r.accept(c0);
  const before = { received: r.received, missing: JSON.stringify(r.missing()), values: values.slice() };
  const cases = [
    ["UNKNOWN_TASK", edit(c1, { transfer: "model-4" }), "expected transfer"],
    ["BAD_CHUNK", edit(c1, { total: 4 }), "total 4"],
    ["DUPLICATE", c0, "twice"],
    ["BAD_CHUNK", edit(c1, { layer: 9 }), "no block"],
    ["BAD_CHUNK", edit(c1, { part: "Z" }), "no block"],
    ["BAD_CHUNK", edit(c1, { blocks: 99 }), "spans 99 blocks"],
    ["BAD_CHUNK", edit(c1, { row_end: 9 }), "out of range"], // past the last block's rows
    ["BAD_CHUNK", edit(c2, { blocks: 1, row_start: 0, row_end: 9 }), "out of range"],
    ["BAD_CHUNK", edit(c1, { row_start: 5 }), "out of range"], // spans: row_start >= rows of the first
    ["BAD_CHUNK", edit(c1, { payload: Uint8Array.of(...c1.payload, 0, 0, 0, 0) }), "pieces encode"],
    ["BAD_CHUNK", edit(c1, { payload: c1.payload.subarray(4) }), "pieces encode"],
    ["CONFLICT", edit(c1, { seq: 2, layer: 0, part: "W", row_start: 0, row_end: 1, blocks: 1, payload: new Uint8Array(20) }), "overlap"],
    ["BAD_CHUNK", edit(c1, { codec: 99 }), "unknown codec id 99"],
    ["BAD_CHUNK", edit(c1, { codec: 2, payload: encodePiece("int8", new Float32Array(5), 1) }), "pieces encode"],
    ["CHECKSUM", edit(c1, { crc: (c1.crc + 1) >>> 0 }), "crc32"],
    ["CHECKSUM", edit(c1, { payload: c1.payload.map((b, i) => (i === 7 ? b ^ 1 : b)), crc: c1.crc }), "crc32"],
    ["BAD_CHUNK", edit(c1, { seq: 5 }), "seq"],
  ];
  for (const [code, chunk, text] of cases) {
    rejects(() => r.accept(chunk), code, text);
    assert.equal(r.received, before.received);
    assert.equal(JSON.stringify(r.missing()), before.missing);
    assert.deepStrictEqual(values, before.values);
  }
  // a result's chunks must carry task.upload_codec's id
  rejects(() => fresh({ expectCodec: 2 }).accept(c0), "BAD_CHUNK", "upload codec");
  // the transfer still completes from the valid chunks
  r.accept(c2);
  r.accept(c1);
  assert.ok(r.complete);
  assert.deepStrictEqual(r.result(), flat);
  void layout;
});

test("§5.3: the codec refusing a payload is BAD_CHUNK", () => {
  const layout = paramsLayout([4, 2]);
  const good = encodeTransfer(new Float32Array(10).fill(1), layout, { transfer: "t", codec: "int8", maxMessageBytes: 4096 });
  const r = new Reassembler(layout, { transfer: "t", total: good.length, expectCodec: 2 });
  const p = good[0].payload.slice();
  p[p.length - 1] = 0x80; // an int8 of -128
  rejects(() => r.accept(edit(good[0], { payload: p })), "BAD_CHUNK", "-128");
  const scale = good[0].payload.slice();
  scale.set([0, 0, 0xc0, 0x7f], 0); // a NaN scale
  rejects(() => r.accept(edit(good[0], { payload: scale })), "BAD_CHUNK", "scale");
  rejects(() => r.accept(edit(good[0], { payload: good[0].payload.subarray(1) })), "BAD_CHUNK", "bytes");
  good.forEach((c) => r.accept(c));
  assert.ok(r.complete);
});

test("§5.3 with spans and top-k: sizes come from each piece's count header", () => {
  const { layout, flat } = randomModel([5, 5, 5, 5, 3], new Xoshiro(10, 0));
  const chunks = encodeTransfer(flat, layout, { transfer: "t", codec: "topk:0.5", maxMessageBytes: 4096, spans: true });
  assert.equal(chunks.length, 1);
  const r = new Reassembler(layout, { transfer: "t", total: 1 });
  const p = chunks[0].payload.slice();
  assert.equal(new DataView(p.buffer).getUint32(0, true), 13); // ceil(0.5 · 25)
  new DataView(p.buffer).setUint32(0, 12, true); // the first piece claims 12: sizes no longer add up
  rejects(() => r.accept(edit(chunks[0], { payload: p })), "BAD_CHUNK");
  new DataView(p.buffer).setUint32(0, 2 ** 32 - 1, true);
  rejects(() => r.accept(edit(chunks[0], { payload: p })), "BAD_CHUNK");
  r.accept(chunks[0]);
  assert.ok(r.complete);
});

test("reassembler bookkeeping: total, missing rows and seqs, result only when complete", () => {
  const { layout, chunks, fresh } = fixture();
  assert.throws(() => new Reassembler(layout, { transfer: "x", total: 0 }), ProtocolError);
  rejects(() => new Reassembler(layout, { transfer: "x", total: 1000 }), "BAD_FIELD", "num_chunks");
  const r = fresh();
  assert.deepStrictEqual(r.missingSeqs(), [0, 1, 2]);
  assert.throws(() => r.result(), /not complete/);
  r.accept(chunks[1]);
  assert.deepStrictEqual(r.missingSeqs(), [0, 2]);
  const miss = r.missing();
  assert.deepStrictEqual(miss[0], { layer: 0, part: "W", rowStart: 0, rowEnd: 5 });
  assert.ok(miss.some((m) => m.layer === 1 && m.part === "W" && m.rowStart === 0 && m.rowEnd === chunks[1].row_start));
  // total unknown: taken from the first accepted chunk, not from a refused one
  const open = new Reassembler(layout, { transfer: "model-3" });
  rejects(() => open.accept(edit(chunks[0], { total: 1000 })), "BAD_CHUNK");
  rejects(() => open.accept(edit(chunks[0], { total: 4, crc: 0 })), "CHECKSUM");
  assert.equal(open.total, null);
  chunks.forEach((c) => open.accept(c));
  assert.ok(open.complete);
  // `out`: fill a caller's buffer in place
  const out = new Float32Array(layout.at(-1).offset + layout.at(-1).size);
  const into = fresh({ out });
  chunks.forEach((c) => into.accept(c));
  assert.equal(into.result(), out);
});
