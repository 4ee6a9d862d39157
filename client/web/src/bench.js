// A benchmark worker (benchmarks/browser.py): train steps per second of the
// browser client's numerics inside a real browser's Web Worker, with either
// kernel set. Not loaded by the volunteer page.
//
// Message in: {widths, batch, kernels: "wasm" | "js", seconds, loss, optimizer}.
// Message out: {stepsPerS, steps, seconds, kernels} or {error}.

import { jsKernels, loadWasmKernels } from "./kernels.js";
import { measureSteps } from "./stepsbench.js";

/** @param {string} which */
async function kernelsFor(which) {
  if (which === "js") return jsKernels;
  return loadWasmKernels(fetch(new URL("kernels.wasm", self.location.href)));
}

/** @param {MessageEvent<Parameters<typeof measureSteps>[0] & {kernels: string}>} ev */
self.onmessage = async (ev) => {
  try {
    postMessage(measureSteps(ev.data, await kernelsFor(ev.data.kernels)));
  } catch (err) {
    postMessage({ error: err instanceof Error ? err.message : String(err) });
  }
};
