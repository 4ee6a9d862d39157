import { test } from "node:test";
import assert from "node:assert/strict";
import { paramsLayout, paramCount, normalizeSpec } from "../src/spec.js";

test("presets have the brief's parameter counts", () => {
  assert.equal(paramCount([5, 5, 5, 5, 3]), 108);
  assert.equal(paramCount([10, 128, 128, 10]), 19210);
  assert.equal(paramCount([10, 32768, 32768, 32768, 10]), 2148237322);
});

test("layout is W then b per layer, contiguous", () => {
  const blocks = paramsLayout([3, 4, 2]);
  assert.deepEqual(
    blocks.map((b) => [b.layer, b.part, b.rows, b.cols, b.offset]),
    [[0, "W", 4, 3, 0], [0, "b", 4, 0, 12], [1, "W", 2, 4, 16], [1, "b", 2, 0, 24]],
  );
});

test("spec defaults: relu hidden, identity out, softmax_ce, he", () => {
  assert.deepEqual(normalizeSpec({ widths: [2, 3, 4] }), {
    widths: [2, 3, 4], activations: ["relu", "identity"], loss: "softmax_ce", init: "he",
  });
});
