// The browser client's side of benchmarks/replicas.py: computes a batch of tasks
// with both kernel sets of src/nn.js (plain JS, float64 sums; WebAssembly SIMD,
// float32 sums), exactly as a tab's worker does, so that Python can compare each
// result with its own client's and with the coordinator's agreement rule.
//   node bench/pairs.mjs IN.msgpack OUT.msgpack
// IN: {spec, models: [f32 bytes], shards: [{X: f32 bytes, y: i32 bytes, n, f}],
//      tasks: [{model, shard, task}]} (task: the decoded §3.3 map, spec left out).
// OUT: {kernels: [names], updates: [[bytes per kernel] per task], losses: [[...]]}.
import { readFileSync, writeFileSync } from "node:fs";
import { decode, encode } from "@msgpack/msgpack";
import { jsKernels, loadWasmKernels } from "../src/kernels.js";
import { startTask } from "../src/nn.js";

const [inPath, outPath] = process.argv.slice(2);
if (!inPath || !outPath) {
  console.error("usage: node bench/pairs.mjs IN.msgpack OUT.msgpack");
  process.exit(2);
}
const wasm = await loadWasmKernels(readFileSync(new URL("../static/kernels.wasm", import.meta.url)));
const KERNELS = [jsKernels, wasm];

/** msgpack bin → a typed array on its own aligned buffer (a copy: the decoder's
 *  bin may be a view into the whole file, and Buffer#slice does not copy) */
const f32 = (/** @type {Uint8Array} */ b) => new Float32Array(new Uint8Array(b).buffer);
const i32 = (/** @type {Uint8Array} */ b) => new Int32Array(new Uint8Array(b).buffer);

// seeds are uint64: BigInts, as the worker decodes them (src/wire.js)
const doc = /** @type {any} */ (decode(readFileSync(inPath), { useBigInt64: true }));
const models = doc.models.map(f32);
const shards = doc.shards.map((/** @type {any} */ s) => ({ X: f32(s.X), y: i32(s.y), n: s.n, f: s.f, t: 0 }));
const updates = [];
const losses = [];
for (const item of doc.tasks) {
  const task = { ...item.task, spec: doc.spec };
  const ups = [];
  const ls = [];
  for (const kernels of KERNELS) {
    const run = startTask(task, models[item.model], shards[item.shard], kernels);
    while (!run.done) run.advance(1 << 20);
    const res = run.result();
    ups.push(new Uint8Array(res.update.buffer, res.update.byteOffset, res.update.byteLength));
    ls.push(res.loss);
  }
  updates.push(ups);
  losses.push(ls);
}
writeFileSync(outPath, encode({ kernels: KERNELS.map((k) => k.name), updates, losses }));
