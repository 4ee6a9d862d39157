// Train steps per second of the browser client's numerics (src/nn.js): one
// measurement, shared by the browser benchmark's worker (src/bench.js, driven by
// benchmarks/browser.py) and the node script bench/steps.mjs.

import { Generator } from "./rng.js";
import { initParams, startTask } from "./nn.js";

/** @typedef {import("./kernels.js").Kernels} Kernels */

/** Random rows for `widths` (labels for softmax_ce).
 *  @param {number[]} widths @returns {import("./nn.js").Rows} */
export function benchRows(widths, n = 2048) {
  const f = widths[0];
  const K = widths[widths.length - 1];
  const g = new Generator(1, 0);
  const X = new Float32Array(n * f);
  g.normalInto(X, 1);
  const y = Int32Array.from({ length: n }, () => g.below(K));
  return { X, y, n, f, t: 0 };
}

/** Steps per second of one train task over about `seconds`, after `warmMs` of warm-up.
 *  @param {{widths: number[], batch?: number, seconds?: number, loss?: string,
 *    optimizer?: Record<string, unknown>, warmMs?: number}} options
 *  @param {Kernels} kernels */
export function measureSteps(
  { widths, batch = 16, seconds = 1, loss = "softmax_ce", optimizer = { kind: "sgd", lr: 0.01 }, warmMs = 300 },
  kernels,
) {
  const spec = { widths, loss };
  const task = { kind: "train", spec, steps: 1e9, batch, seed: 5, optimizer };
  const run = startTask(task, initParams(spec, 0), benchRows(widths), kernels);
  const warm = performance.now();
  while (performance.now() - warm < warmMs) run.advance(20);
  let steps = 0;
  const t0 = performance.now();
  let t = t0;
  while (t - t0 < seconds * 1000) {
    steps += run.advance(20);
    t = performance.now();
  }
  run.close();
  return { stepsPerS: (steps * 1000) / (t - t0), steps, seconds: (t - t0) / 1000, kernels: kernels.name };
}
