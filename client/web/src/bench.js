// A benchmark worker (benchmarks/browser.py): train steps per second of the
// browser client's numerics inside a real browser's Web Worker, with either
// kernel set. Not loaded by the volunteer page.
//
// Message in: {widths, batch, kernels: "wasm" | "js", seconds, loss, optimizer}.
// Message out: {stepsPerS, steps, seconds, kernels} or {error}.

import { Generator } from "./rng.js";
import { initParams, startTask } from "./nn.js";
import { jsKernels, loadWasmKernels } from "./kernels.js";

const ROWS = 2048;

async function kernelsFor(which) {
  if (which === "js") return jsKernels;
  return loadWasmKernels(fetch(new URL("kernels.wasm", self.location.href)));
}

function rowsFor(widths) {
  const f = widths[0];
  const K = widths.at(-1);
  const g = new Generator(1, 0);
  const X = new Float32Array(ROWS * f);
  g.normalInto(X, 1);
  const y = Int32Array.from({ length: ROWS }, () => g.below(K));
  return { X, y, n: ROWS, f, t: 0 };
}

async function measure({ widths, batch, kernels, seconds, loss, optimizer }) {
  const k = await kernelsFor(kernels);
  const spec = { widths, loss: loss ?? "softmax_ce" };
  const task = {
    kind: "train", spec, steps: 1e9, batch, seed: 5,
    optimizer: optimizer ?? { kind: "sgd", lr: 0.01 },
  };
  const run = startTask(task, initParams(spec, 0), rowsFor(widths), k);
  const warm = performance.now();
  while (performance.now() - warm < 300) run.advance(20);
  let steps = 0;
  const t0 = performance.now();
  let t = t0;
  while (t - t0 < seconds * 1000) {
    steps += run.advance(20);
    t = performance.now();
  }
  run.close();
  return { stepsPerS: (steps * 1000) / (t - t0), steps, seconds: (t - t0) / 1000, kernels: k.name };
}

self.onmessage = async (ev) => {
  try {
    postMessage(await measure(ev.data));
  } catch (err) {
    postMessage({ error: String(err?.message ?? err) });
  }
};
