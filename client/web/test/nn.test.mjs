// The numerics against tests/vectors/compute/ (docs/protocol.md §12): the seeded
// init bit for bit, every task_*.json to the §12.8 tolerance with both kernel
// sets, and slicing invariance of advance().
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import v8 from "node:v8";
import vm from "node:vm";
import { Generator } from "../src/rng.js";
import { initParams, initStd, parseOptimizer, predict, startTask } from "../src/nn.js";
import { jsKernels, loadWasmKernels } from "../src/kernels.js";
import { normalizeSpec, paramsLayout } from "../src/spec.js";
import { crc32 } from "../src/crc32.js";
import { taskRows } from "../src/session.js";

const VECTORS = new URL("../../../tests/vectors/compute/", import.meta.url);
const load = (name) => JSON.parse(readFileSync(new URL(name, VECTORS), "utf8"));
const wasmKernels = await loadWasmKernels(readFileSync(new URL("../static/kernels.wasm", import.meta.url)));
const KERNELS = [jsKernels, wasmKernels];

const bytesOf = (f32) => new Uint8Array(f32.buffer, f32.byteOffset, f32.byteLength);

// -- init ------------------------------------------------------------------------------

const init = load("init.json");

/** The CRC of a preset's init, one layer at a time in 4 M-value pieces (huge: 134 MB otherwise). */
function streamedCrc(spec, seed) {
  const buf = new Float32Array(1 << 22);
  let crc = 0;
  for (const blk of paramsLayout(spec.widths)) {
    if (blk.part === "b") {
      crc = crc32(new Uint8Array(4 * blk.size), crc);
      continue;
    }
    const g = new Generator(seed, blk.layer);
    const std = initStd(spec, blk.layer);
    for (let left = blk.size; left > 0; ) {
      const m = Math.min(left, buf.length);
      g.normalInto(buf, std, 0, m);
      crc = crc32(bytesOf(buf.subarray(0, m)), crc);
      left -= m;
    }
  }
  return crc;
}

for (const p of init.presets) {
  // extreme draws 26 G words: only its first weights are checked.
  const whole = p.num_params <= 3e6;
  const streamed = !whole && p.preset !== "extreme";
  test(`init ${p.preset}: ${whole ? "initParams CRC" : streamed ? "streamed CRC" : "first weights"}`, () => {
    const spec = normalizeSpec(p.spec);
    for (const [l, want] of p.first_weights.entries()) {
      const head = new Float32Array(4);
      new Generator(p.seed, l).normalInto(head, initStd(spec, l));
      assert.deepEqual(Array.from(head), want, `layer ${l}`);
    }
    if (whole) {
      const params = initParams(spec, p.seed);
      assert.equal(params.length, p.num_params);
      assert.equal(crc32(bytesOf(params)), p.crc32);
      const blocks = paramsLayout(spec.widths).filter((b) => b.part === "W");
      for (const [l, want] of p.first_weights.entries()) {
        assert.deepEqual(Array.from(params.subarray(blocks[l].offset, blocks[l].offset + 4)), want);
      }
    } else if (streamed) {
      assert.equal(streamedCrc(spec, p.seed), p.crc32);
    }
  });
}

test("init: the whole small Xavier model, bit for bit", () => {
  const params = initParams(init.whole.spec, init.whole.seed);
  assert.deepEqual(Array.from(params), init.whole.params);
  assert.equal(crc32(bytesOf(params)), init.whole.crc32);
});

test("init: a BigInt seed gives the same model as the Number", () => {
  assert.deepEqual(initParams(init.whole.spec, 3n), initParams(init.whole.spec, 3));
});

// -- tasks --------------------------------------------------------------------------------

const TASK_FILES = readdirSync(VECTORS).filter((f) => /^task_.*\.json$/.test(f)).sort();

function setup(doc) {
  const spec = normalizeSpec(doc.spec);
  const f = spec.widths[0], K = spec.widths.at(-1);
  const X = Float32Array.from(doc.X);
  const n = X.length / f;
  // y_kind (§12.8): int class labels, or float targets of width K
  assert.ok(doc.y_kind === "labels" || doc.y_kind === "targets", `${doc.name}: y_kind`);
  const shard = doc.y_kind === "targets"
    ? { X, y: Float32Array.from(doc.y), n, f, t: K }
    : { X, y: Int32Array.from(doc.y), n, f, t: 0 };
  const task = { ...doc.task, spec: doc.spec };
  // §12.2, §13: `indices` picks the task's rows of the shard, in its order
  if (doc.task.indices) task.indices = { dtype: "uint32", shape: [doc.task.indices.length], data: Uint32Array.from(doc.task.indices) };
  const rows = taskRows(task, shard);
  if (doc.task.teacher_logits) {
    task.teacher_logits = { dtype: "float16", shape: [n, K], data: Float32Array.from(doc.task.teacher_logits) };
  }
  return { spec, rows, task, start: Float32Array.from(doc.base) };
}

function checkResult(got, doc, what) {
  const want = doc.expected, tol = doc.tolerance;
  assert.equal(got.samples, want.samples, `${what}: samples`);
  assert.equal(got.steps, want.steps, `${what}: steps`);
  assert.deepEqual(got.metrics, want.metrics, `${what}: metrics`);
  assert.ok(
    Math.abs(got.loss - want.loss) <= tol.loss_rtol * Math.abs(want.loss),
    `${what}: loss ${got.loss}, want ${want.loss}`,
  );
  if (want.update.length === 0) {
    assert.equal(got.update, null, `${what}: evaluate sends no update`);
    return;
  }
  if (want.boundary === undefined) {
    assert.equal(got.boundary, undefined, `${what}: no boundary asked`);
  } else {  // §3.3.2: every row's activations at that hidden layer, after training
    assert.equal(got.boundary?.length, want.boundary.length, `${what}: boundary length`);
    for (let k = 0; k < want.boundary.length; k++) {
      const w = want.boundary[k], g = got.boundary[k];
      assert.ok(
        Math.abs(g - w) <= tol.update_atol + tol.update_rtol * Math.abs(w),
        `${what}: boundary[${k}] = ${g}, want ${w}`,
      );
    }
  }
  assert.equal(got.update.length, want.update.length, `${what}: update length`);
  for (let k = 0; k < want.update.length; k++) {
    const w = want.update[k], g = got.update[k];
    assert.ok(
      Math.abs(g - w) <= tol.update_atol + tol.update_rtol * Math.abs(w),
      `${what}: update[${k}] = ${g}, want ${w}`,
    );
  }
}

for (const file of TASK_FILES) {
  const doc = load(file);
  const { spec, rows, task, start } = setup(doc);

  test(`${doc.name}: the start model is x128ss-ih12 of init_seed ${doc.init_seed}`, () => {
    assert.deepEqual(Array.from(initParams(spec, doc.init_seed)), doc.base);
  });

  for (const kernels of KERNELS) {
    test(`${doc.name} (${kernels.name}): matches the vector`, () => {
      const before = start.slice();
      const run = startTask(task, start, rows, kernels);
      const seen = [];
      // One step at a time, to see the rows each step trained on (§12.2, exact).
      while (!run.done) {
        assert.equal(run.advance(1), 1);
        if (doc.batches) seen.push(Array.from(run.rowIndex));
      }
      if (doc.batches) assert.deepEqual(seen, doc.batches, "batches");
      if (doc.batch_shard_rows) {  // positions in the task's rows name these shard rows
        assert.deepEqual(seen.map((b) => b.map((p) => doc.task.indices[p])), doc.batch_shard_rows);
      }
      if (doc.rows) assert.deepEqual(Array.from(run.rowIndex), doc.rows, "gradient rows");
      assert.equal(run.advance(5), 0);
      checkResult(run.result(), doc, `${doc.name} ${kernels.name}`);
      assert.deepEqual(start, before, "the start model is left unchanged");
    });

    test(`${doc.name} (${kernels.name}): slicing advance() does not change the result`, () => {
      const whole = startTask(task, start, rows, kernels);
      assert.equal(whole.advance(Infinity), whole.total);
      assert.ok(whole.done);
      const a = whole.result();
      const sliced = startTask(task, start, rows, kernels);
      for (const n of [1, 2, 1, 3]) sliced.advance(n);
      while (!sliced.done) sliced.advance(2);
      const b = sliced.result();
      assert.deepEqual(b, a);
    });
  }
}

test("js and wasm kernels agree on a medium train task to the tolerance", () => {
  const spec = normalizeSpec({ widths: [10, 128, 128, 10] });
  const n = 200;
  const g = new Generator(1, 9);
  const X = new Float32Array(n * 10);
  g.normalInto(X, 1);
  const y = Int32Array.from({ length: n }, () => g.below(10));
  const start = initParams(spec, 4);
  for (const opt of [{ kind: "sgd", lr: 0.05 }, { kind: "adam", lr: 0.001 }, { kind: "momentum", lr: 0.05, nesterov: true }]) {
    const task = { kind: "train", spec, steps: 5, batch: 16, seed: 3, optimizer: opt };
    const rows = { X, y, n, f: 10, t: 0 };
    const [a, b] = KERNELS.map((k) => {
      const run = startTask(task, start, rows, k);
      run.advance();
      return run.result();
    });
    assert.ok(Math.abs(a.loss - b.loss) <= 1e-5 * Math.abs(a.loss), `${opt.kind}: loss`);
    for (let k = 0; k < a.update.length; k++) {
      assert.ok(Math.abs(a.update[k] - b.update[k]) <= 1e-5 + 1e-4 * Math.abs(a.update[k]), `${opt.kind}: update[${k}]`);
    }
  }
});

test("tanh and sigmoid layers agree between js and wasm", () => {
  const spec = { widths: [6, 33, 9, 4], activations: ["tanh", "sigmoid", "identity"], loss: "softmax_ce", init: "xavier" };
  const g = new Generator(2, 0);
  const n = 40;
  const X = new Float32Array(n * 6);
  g.normalInto(X, 3);
  const y = Int32Array.from({ length: n }, () => g.below(4));
  const start = initParams(spec, 8);
  const task = { kind: "gradient", spec, steps: 3, batch: 10, seed: 1 };
  const [a, b] = KERNELS.map((k) => {
    const run = startTask(task, start, { X, y, n, f: 6, t: 0 }, k);
    run.advance();
    return run.result();
  });
  assert.ok(Math.abs(a.loss - b.loss) <= 1e-5 * Math.abs(a.loss));
  for (let k = 0; k < a.update.length; k++) {
    assert.ok(Math.abs(a.update[k] - b.update[k]) <= 1e-5 + 1e-4 * Math.abs(a.update[k]), `update[${k}]`);
  }
});

test("predict: the raw outputs, the same with both kernel sets and as evaluate sees them", () => {
  const doc = load("task_evaluate.json");
  const { spec, rows, start } = setup(doc);
  const [a, b] = KERNELS.map((k) => predict(spec, start, rows.X, rows.n, k));
  assert.equal(a.length, rows.n * 3);
  for (let k = 0; k < a.length; k++) assert.ok(Math.abs(a[k] - b[k]) <= 1e-6 + 1e-5 * Math.abs(a[k]));
  let correct = 0;
  for (let r = 0; r < rows.n; r++) {
    const o = a.subarray(3 * r, 3 * r + 3);
    if (o.indexOf(Math.max(...o)) === rows.y[r]) correct++;
  }
  assert.equal(correct / rows.n, doc.expected.metrics.accuracy);
  // More rows than one block, through the wasm memory.
  const big = new Float32Array(600 * 4);
  new Generator(0, 1).normalInto(big, 1);
  const p1 = predict(spec, start, big, 600, wasmKernels);
  const p2 = predict(spec, start, big, 600, jsKernels);
  for (let k = 0; k < p1.length; k++) assert.ok(Math.abs(p1[k] - p2[k]) <= 1e-6 + 1e-5 * Math.abs(p2[k]));
});

test("optimizer maps: defaults, and refusals start with 'optimizer:'", () => {
  assert.deepEqual(parseOptimizer({}), {
    kind: "sgd", lr: 0.05, momentum: 0.9, nesterov: false, beta1: 0.9, beta2: 0.999, eps: 1e-8,
  });
  for (const bad of [{ kind: "lamb" }, { weight_decay: 0.1 }, { lr: 0 }, { momentum: 1 }, { nesterov: 1 }, { lr: "x" }]) {
    assert.throws(() => parseOptimizer(bad), /^Error: optimizer: /);
  }
  const doc = load("task_train_sgd.json");
  const { rows, task, start } = setup(doc);
  assert.throws(
    () => startTask({ ...task, optimizer: { kind: "sgd", clip: 1 } }, start, rows, wasmKernels),
    (e) => e.message.startsWith("optimizer:"),
  );
});

test("wasm workspaces: views survive growth by re-acquiring, memory is reused after free", () => {
  const a = wasmKernels.workspace([16]);
  a.views()[0].fill(7);
  const before = wasmKernels.memory.buffer.byteLength;
  const big = wasmKernels.workspace([before]); // 4× the memory's bytes in floats: forces growth
  assert.ok(wasmKernels.memory.buffer.byteLength > before);
  assert.equal(a.views()[0][15], 7, "re-acquired view sees the data");
  big.free();
  a.free();
  const c = wasmKernels.workspace([16]);
  assert.throws(() => a.views(), /after free/);
  c.free();
});

test("bad rows and tasks are refused with a reason", () => {
  const doc = load("task_train_sgd.json");
  const { rows, task, start } = setup(doc);
  assert.throws(() => startTask(task, start, { ...rows, y: Int32Array.from(rows.y, () => 3) }, jsKernels), /label 3/);
  assert.throws(() => startTask(task, start.subarray(1), rows, jsKernels), /start model/);
  assert.throws(() => startTask({ ...task, kind: "dream" }, start, rows, jsKernels), /kind/);
  assert.throws(() => startTask({ ...task, kind: "distill" }, start, rows, jsKernels), /teacher_logits/);
});

test("expd: e^x to 1e-15 relative over the whole float64 range", async () => {
  const { expd } = await import("../src/kernels.js");
  const g = new Generator(3, 3);
  let worst = 0;
  for (let k = 0; k < 200000; k++) {
    const x = (g.nextU32() / 2 ** 32 - 0.5) * (k % 2 ? 20 : 1500);
    const want = Math.exp(x);
    if (want > 1e-300 && want < Infinity) worst = Math.max(worst, Math.abs(expd(x) - want) / want);
  }
  assert.ok(worst < 1e-15, `worst relative error ${worst}`);
  assert.equal(expd(0), 1);
  assert.equal(expd(-Infinity), 0);
  assert.equal(expd(800), Infinity);
  assert.ok(Number.isNaN(expd(NaN)));
  assert.ok(Math.abs(expd(-744) - Math.exp(-744)) <= 1e-323);
});

test("a task dropped without close() gives its wasm memory back once collected", async () => {
  v8.setFlagsFromString("--expose-gc");
  const gc = vm.runInNewContext("gc"); // the collector, without a node flag
  const doc = load("task_train_sgd.json");
  const { rows, task, start } = setup(doc);
  const probe = () => {
    const ws = wasmKernels.workspace([1]);
    const addr = ws.views()[0].wasmAddr;
    ws.free();
    return addr;
  };
  const base = probe();
  (() => startTask(task, start, rows, wasmKernels).advance(1))(); // dropped
  assert.ok(probe() > base, "the dropped task's block is still held");
  for (let i = 0; i < 20 && probe() !== base; i++) {
    gc();
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.equal(probe(), base);
});
