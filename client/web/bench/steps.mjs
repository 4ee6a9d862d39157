// Train steps per second of src/nn.js, plain JS kernels vs WebAssembly SIMD,
// on the tiny / small / medium presets at batch 16:
//   node bench/steps.mjs [seconds per case] [optimizer kind] [loss]
// (defaults 1, sgd, softmax_ce).
import { readFileSync } from "node:fs";
import { Generator } from "../src/rng.js";
import { initParams, startTask } from "../src/nn.js";
import { jsKernels, loadWasmKernels } from "../src/kernels.js";

const PRESETS = {
  tiny: [5, 5, 5, 5, 3],
  small: [10, 16, 16, 16, 10],
  medium: [10, 128, 128, 10],
};
const BATCH = 16;
const seconds = Number(process.argv[2] ?? 1);
const optKind = process.argv[3] ?? "sgd";
const loss = process.argv[4] ?? "softmax_ce";

const wasm = await loadWasmKernels(readFileSync(new URL("../static/kernels.wasm", import.meta.url)));

function rowsFor(widths, n = 4096) {
  const f = widths[0], K = widths.at(-1);
  const g = new Generator(1, 0);
  const X = new Float32Array(n * f);
  g.normalInto(X, 1);
  const y = Int32Array.from({ length: n }, () => g.below(K));
  return { X, y, n, f, t: 0 };
}

/** Steps per second over about `secs` seconds, after a warm-up. */
function measure(widths, kernels, secs) {
  const spec = { widths, loss };
  const rows = rowsFor(widths);
  const start = initParams(spec, 0);
  const task = { kind: "train", spec, steps: 1e9, batch: BATCH, seed: 5, optimizer: { kind: optKind, lr: 0.01 } };
  const run = startTask(task, start, rows, kernels);
  const warm = performance.now();
  while (performance.now() - warm < 200) run.advance(50);
  let steps = 0;
  const t0 = performance.now();
  let t = t0;
  while (t - t0 < secs * 1000) {
    steps += run.advance(50);
    t = performance.now();
  }
  run.close();
  return (steps * 1000) / (t - t0);
}

console.log(`node ${process.version}, batch ${BATCH}, optimizer ${optKind}, loss ${loss}, ${seconds} s per case`);
console.log("preset   js steps/s   wasm-simd steps/s   speedup");
for (const [name, widths] of Object.entries(PRESETS)) {
  const js = measure(widths, jsKernels, seconds);
  const ws = measure(widths, wasm, seconds);
  console.log(
    `${name.padEnd(8)} ${js.toFixed(0).padStart(10)}   ${ws.toFixed(0).padStart(17)}   ${(ws / js).toFixed(2).padStart(6)}x`,
  );
}
