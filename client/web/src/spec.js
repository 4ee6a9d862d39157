// The model spec and the Params layout (docs/protocol.md §3.11, §5.2).
//
// One flat Float32Array holds a model, a delta or a gradient in Params layout
// order: per layer l, W_l row-major (w[l+1] rows of w[l]), then b_l. Every part
// of the client (numerics, codecs, chunks, the page) speaks this one type.

/** A block of a layout: `rows` × `cols` values (cols 0: a 1-D block, a bias) at
 *  `offset` of the flat array, `size` of them.
 *  @typedef {{layer: number, part: string, rows: number, cols: number, offset: number, size: number}} Block */

/** A model spec as it travels (§3.11): the defaults may be missing.
 *  @typedef {{widths: number[], activations?: string[], loss?: string, init?: string}} Spec */

/** A spec with its defaults filled in (normalizeSpec).
 *  @typedef {{widths: number[], activations: string[], loss: string, init: string}} FullSpec */

/** The blocks of the Params layout: [{layer, part, rows, cols, offset, size}];
 *  cols is 0 for a 1-D block (a bias).
 *  @param {readonly number[]} widths
 *  @returns {Block[]} */
export function paramsLayout(widths) {
  /** @type {Block[]} */
  const blocks = [];
  let offset = 0;
  for (let l = 0; l + 1 < widths.length; l++) {
    const rows = widths[l + 1];
    const cols = widths[l];
    blocks.push({ layer: l, part: "W", rows, cols, offset, size: rows * cols });
    offset += rows * cols;
    blocks.push({ layer: l, part: "b", rows, cols: 0, offset, size: rows });
    offset += rows;
  }
  return blocks;
}

/** Parameter count of a spec's widths, biases included. */
/** @param {readonly number[]} widths */
export function paramCount(widths) {
  let n = 0;
  for (let l = 0; l + 1 < widths.length; l++) n += widths[l + 1] * (widths[l] + 1);
  return n;
}

/** The spec map with its defaults filled in (§3.11). */
/** @param {Spec} spec
 *  @returns {FullSpec} */
export function normalizeSpec(spec) {
  const L = spec.widths.length - 1;
  const activations =
    spec.activations ?? Array.from({ length: L }, (_, i) => (i + 1 < L ? "relu" : "identity"));
  return {
    widths: spec.widths.slice(),
    activations: activations.slice(),
    loss: spec.loss ?? "softmax_ce",
    init: spec.init ?? "he",
  };
}
