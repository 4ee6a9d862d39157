// Whole exchanges from tests/vectors (docs/protocol.md §10): the browser session
// fed the reference server's frames must upload what the reference client did
// (values to the §12.8 tolerance; this client fetches shards over HTTP, so its
// `fetch` frames are the worker's business). And the sub-model merge vector,
// from §3.3.1's words alone.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Session } from "../src/session.js";
import { decodeFrame } from "../src/wire.js";
import { Reassembler } from "../src/chunks.js";
import { parseShard } from "../src/shard.js";
import { startTask } from "../src/nn.js";
import { paramsLayout } from "../src/spec.js";
import { fromHex } from "../src/bytes.js";
import { computeJson, vectorBytes, vectorJson } from "./helpers.mjs";

const ATOL = 1e-5, RTOL = 1e-4;

function exchange(name) {
  const doc = vectorJson(name);
  return doc.steps.map((s) => ({ ...s, msg: decodeFrame(vectorBytes(s.frame)) }));
}

const close = (g, w) => Math.abs(g - w) <= ATOL + RTOL * Math.abs(w);

/** Drive a Session with the server's frames of `conn`; compute every task in
 *  `compute` at once; returns the decoded frames it sends. */
function replay(session, steps, conn, compute, now) {
  const up = [];
  const shards = new Map(steps.filter((s) => s.msg.type === "data").map((s) => [s.msg.data, parseShard(s.msg.payload)]));
  const act = (actions) => {
    for (const a of actions) {
      if (a.type === "send") up.push(decodeFrame(a.frame));
      else if (a.type === "shard") act(session.shardReady(a.sha, shards.get(a.sha), now));
      else if (a.type === "compute" && compute.includes(a.task.task_id)) {
        const run = startTask(a.task, a.params, a.rows);
        run.advance(Infinity);
        act(session.computeDone(a.requestId, { ...run.result(), computeSeconds: 0.5 }, now));
      }
    }
  };
  act(session.start(now));
  for (const s of steps) if (s.conn === conn && s.dir === "down") act(session.receive(s.msg, now));
  return up;
}

function sameUpload(got, want, what) {
  assert.equal(got.type, want.type, what);
  if (want.type === "chunk") {
    for (const k of ["transfer", "seq", "total", "layer", "part", "row_start", "row_end", "codec"]) {
      assert.equal(got[k], want[k], `${what}.${k}`);
    }
    assert.equal(got.blocks ?? 1, want.blocks ?? 1, `${what}.blocks`);
    const g = new Float32Array(got.payload.slice().buffer), w = new Float32Array(want.payload.slice().buffer);
    assert.equal(g.length, w.length, `${what}: payload`);
    for (let i = 0; i < w.length; i++) assert.ok(close(g[i], w[i]), `${what}[${i}] = ${g[i]}, want ${w[i]}`);
  } else if (want.type === "result") {
    assert.ok(Math.abs(got.loss - want.loss) <= 1e-5 * Math.abs(want.loss), `${what}.loss`);
    assert.deepEqual({ ...got, loss: 0 }, { ...want, loss: 0 }, what);
  } else if (want.type === "hello") {
    assert.equal(got.resume, want.resume, `${what}.resume`);
  } else {
    assert.deepEqual(got, want, what);
  }
}

test("exchange_resume: a resume is told by welcome's token, not its session_id (§6)", () => {
  const steps = exchange("exchange_resume");
  const find = (conn, dir, type) => steps.find((s) => s.conn === conn && s.dir === dir && s.type === type).msg;
  const w1 = find(1, "down", "welcome"), h2 = find(2, "up", "hello"), w2 = find(2, "down", "welcome");
  assert.equal(find(1, "up", "hello").resume, null);
  assert.equal(h2.resume, w1.resume_token);
  assert.equal(w2.resume_token, h2.resume, "same token: the session resumed");
  assert.notEqual(w2.session_id, w1.session_id, "session_id names the connection");
  const t1 = find(1, "down", "task"), t2 = find(2, "down", "task");
  assert.notEqual(t2.task_id, t1.task_id, "the task is not sent again; a new one comes");
  const lost = steps.filter((s) => s.delivered === false);
  const again = steps.filter((s) => s.conn === 2 && s.dir === "up" && ["result", "chunk"].includes(s.type));
  assert.deepEqual(again.map((s) => s.msg), lost.map((s) => s.msg), "the kept result goes again, unchanged");
  assert.deepEqual(find(2, "down", "ack"), { type: "ack", task_id: t1.task_id, accepted: true, reason: "" });
});

test("exchange_resume: the browser session uploads what the reference did, and resends it", () => {
  const steps = exchange("exchange_resume");
  const s = new Session({});
  const t1 = steps.find((x) => x.type === "task").msg.task_id;
  const up1 = replay(s, steps, 1, [t1], 0);
  const want1 = steps.filter((x) => x.conn === 1 && x.dir === "up" && x.type !== "fetch").map((x) => x.msg);
  assert.equal(up1.length, want1.length);
  up1.forEach((g, i) => sameUpload(g, want1[i], `conn 1 frame ${i}`));
  s.connectionLost(1);
  const up2 = replay(s, steps, 2, [], 2);
  const want2 = steps.filter((x) => x.conn === 2 && x.dir === "up" && x.type !== "bye").map((x) => x.msg);
  assert.equal(up2.length, want2.length);
  up2.forEach((g, i) => sameUpload(g, want2[i], `conn 2 frame ${i}`));
  assert.equal(s.unacked.size, 0, "the ack was matched by task_id");
});

test("exchange_boundary: the update's blocks, then (L, 'h') with every row (§3.3.2)", () => {
  const doc = vectorJson("exchange_boundary");
  const steps = exchange("exchange_boundary");
  const task = steps.find((x) => x.type === "task").msg;
  const ups = steps.filter((x) => x.dir === "up" && x.type !== "fetch").map((x) => x.msg);
  const got = replay(new Session({}), steps, 1, [task.task_id], 0);
  assert.equal(got.length, ups.length);
  got.forEach((g, i) => sameUpload(g, ups[i], `frame ${i}`));
  const [rows, width] = doc.boundary_shape;
  const layout = paramsLayout(task.spec.widths);
  const last = layout.at(-1);
  const h = { layer: task.spec.widths.length - 1, part: "h", rows, cols: width, offset: last.offset + last.size, size: rows * width };
  assert.deepEqual([...layout, h].map((b) => [b.layer, b.part]), doc.result_layout);
  const result = ups.find((m) => m.type === "result");
  const chunks = ups.filter((m) => m.type === "chunk");
  assert.equal(result.num_chunks, chunks.length);
  const r = new Reassembler([...layout, h], { transfer: task.task_id, total: result.num_chunks });
  for (const c of chunks.reverse()) r.accept(c);
  const flat = r.result();
  const want = computeJson("task_train_boundary").expected;
  const all = [...want.update, ...want.boundary];
  assert.equal(flat.length, all.length);
  for (let i = 0; i < all.length; i++) assert.ok(close(flat[i], all[i]), `value ${i}`);
});

test("subnet_merge: slice and merge as §3.3.1 states them", () => {
  const doc = vectorJson("subnet_merge");
  const f32 = (k) => new Float32Array(fromHex(doc[k].$bin).slice().buffer);
  const full = f32("model_le_f32"), sub = doc.subnet_spec.widths, whole = doc.spec.widths;
  const keep = [];
  for (let l = 1, at = 0; l < sub.length - 1; at += sub[l], l++) keep.push(doc.subnet.slice(at, at + sub[l]));
  const all = (n) => Array.from({ length: n }, (_, i) => i);
  const L = whole.length - 1;
  const rows = [...keep, all(whole[L])], cols = [all(whole[0]), ...keep];
  const scale = (l) => (l === 0 ? 1 : Math.fround((whole[l] / keep[l - 1].length) ** doc.rescale));
  assert.deepEqual(all(L).map(scale), doc.scales);
  const big = paramsLayout(whole), small = paramsLayout(sub);
  const slice = new Float32Array(small.at(-1).offset + small.at(-1).size);
  const merged = new Float32Array(full.length), upd = f32("update_le_f32");
  for (let l = 0; l < L; l++) {
    const [W, b] = [big[2 * l], big[2 * l + 1]], [w, sb] = [small[2 * l], small[2 * l + 1]];
    rows[l].forEach((r, i) => {
      cols[l].forEach((c, j) => {
        slice[w.offset + i * w.cols + j] = Math.fround(full[W.offset + r * W.cols + c] * scale(l));
        merged[W.offset + r * W.cols + c] = Math.fround(upd[w.offset + i * w.cols + j] / scale(l));
      });
      slice[sb.offset + i] = full[b.offset + r];
      merged[b.offset + r] = upd[sb.offset + i];
    });
  }
  assert.deepEqual(slice, f32("slice_le_f32"));
  assert.deepEqual(merged, f32("merged_le_f32"));
});
