// Train steps per second of src/nn.js, plain JS kernels vs WebAssembly SIMD,
// on the tiny / small / medium presets at batch 16, in node:
//   node bench/steps.mjs [seconds per case] [optimizer kind] [loss]
// (defaults 1, sgd, softmax_ce). benchmarks/browser.py measures the same in
// Chromium's worker beside the numba core.
import { readFileSync } from "node:fs";
import { jsKernels, loadWasmKernels } from "../src/kernels.js";
import { measureSteps } from "../src/stepsbench.js";

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

console.log(`node ${process.version}, batch ${BATCH}, optimizer ${optKind}, loss ${loss}, ${seconds} s per case`);
console.log("preset   js steps/s   wasm-simd steps/s   speedup");
for (const [name, widths] of Object.entries(PRESETS)) {
  const job = { widths, batch: BATCH, seconds, loss, optimizer: { kind: optKind, lr: 0.01 } };
  const js = measureSteps(job, jsKernels).stepsPerS;
  const ws = measureSteps(job, wasm).stepsPerS;
  console.log(
    `${name.padEnd(8)} ${js.toFixed(0).padStart(10)}   ${ws.toFixed(0).padStart(17)}   ${(ws / js).toFixed(2).padStart(6)}x`,
  );
}
