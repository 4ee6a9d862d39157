// What a browser client computes (docs/protocol.md §12): the seeded init, and
// train / distill / gradient / evaluate tasks on a flat Float32Array of
// parameters in Params layout order. Pure JavaScript, no DOM: it runs in a Web
// Worker and in node (the tests and bench/steps.mjs).
//
// The arithmetic goes through a kernel set (src/kernels.js): plain JS or
// WebAssembly SIMD. All buffers of a task are allocated once, in the kernel
// set's memory, when the task starts; a step allocates nothing.
//
// Layout: every layer's activations and deltas are feature-major, [width,
// rows] (the reference, nn/kernels.py, does so for hidden layers), so each
// product is a broadcast-A GEMM over contiguous rows of B and C; the input
// batch is kept both ways (Xᵀ for the forward product, X for the first layer's
// weight gradient), and a hidden layer's output is transposed once per step
// for the next layer's weight gradient.
//
// Float64 where the reference uses it (losses, optimizer formulas, the loss
// mean over steps); float32 storage everywhere. Results agree with the
// reference to the §12.8 tolerance, not bit for bit: sums run in another order.
// What is exact is exact: the rows each step draws (§12.2) and the init.

import { normalizeSpec, paramCount } from "./spec.js";
import { Generator } from "./rng.js";
import { ACT, expd, jsKernels } from "./kernels.js";

/** @typedef {import("./spec.js").Spec} Spec */
/** @typedef {import("./spec.js").FullSpec} FullSpec */
/** @typedef {import("./kernels.js").Kernels} Kernels */
/** @typedef {import("./kernels.js").Workspace} Workspace */
/** A task's rows: X [n·f]; y int32 labels [n] (t = 0) or float32 targets [n·t].
 *  @typedef {{X: Float32Array, y: Int32Array | Float32Array, n: number, f: number, t?: number}} Rows */
/** What a task needs of the §3.3 task map (the decoded message, or a bench's);
 *  missing keys take their defaults.
 *  @typedef {{kind?: string, spec: Spec, steps?: number, batch?: number, seed?: number | bigint,
 *    optimizer?: Record<string, unknown>, boundary?: number | null, temperature?: number,
 *    distill_alpha?: number, teacher_logits?: {shape: number[], data: ArrayLike<number>} | null}} TaskLike */
/** A task's result (§12.7): the update (null for evaluate), and with a
 *  boundary, the boundary layer's activations.
 *  @typedef {{update: Float32Array | null, loss: number, samples: number, steps: number,
 *    metrics: Record<string, number>, boundary?: Float32Array}} TaskResult */
/** Integer class labels, one per row (checked in range).
 *  @typedef {Int32Array | Float32Array} Labels */
/** The optimizer map with its defaults (parseOptimizer).
 *  @typedef {{kind: string, lr: number, momentum: number, nesterov: boolean, beta1: number, beta2: number, eps: number}} Optimizer */

/** The portable init of §12.3. */
export const INIT_SCHEME = "x128ss-ih12";

/** Rows per block when a task or predict() runs over many rows at once. */
const BLOCK_ROWS = 256;

const KINDS = new Set(["train", "gradient", "evaluate", "distill"]);

/** The buffers of a Net's workspace, by name.
 *  @typedef {"params" | "XT" | "A" | "D1" | "S" | "G" | "XB" | "D2" | "TR" | "V" | "M1" | "M2"} BufferName */

/** A buffer a network does not have. @type {Float32Array} */
const EMPTY = new Float32Array(0);

/** Per layer {o, i, w, b}: out and in widths, offsets of W and b in the params. */
/** @param {readonly number[]} widths */
function layersOf(widths) {
  /** @type {{o: number, i: number, w: number, b: number}[]} */
  const layers = [];
  let off = 0;
  for (let l = 0; l + 1 < widths.length; l++) {
    const o = widths[l + 1], i = widths[l];
    layers.push({ o, i, w: off, b: off + o * i });
    off += o * i + o;
  }
  return layers;
}

/** @param {FullSpec} spec */
function actCodes(spec) {
  return spec.activations.map((a) => {
    if (!Object.hasOwn(ACT, a)) throw new Error(`spec: unknown activation ${JSON.stringify(a)}`);
    return ACT[/** @type {keyof typeof ACT} */ (a)];
  });
}

/** @param {Spec} spec */
function checkSpec(spec) {
  const s = normalizeSpec(spec);
  const L = s.widths.length - 1;
  if (L < 1 || !s.widths.every((w) => Number.isInteger(w) && w >= 1)) {
    throw new Error(`spec: bad widths ${JSON.stringify(s.widths)}`);
  }
  if (s.activations.length !== L) {
    throw new Error(`spec: ${s.activations.length} activations for ${L} layers`);
  }
  if (s.loss !== "mse" && s.loss !== "softmax_ce") throw new Error(`spec: unknown loss ${JSON.stringify(s.loss)}`);
  if (s.init !== "he" && s.init !== "xavier") throw new Error(`spec: unknown init ${JSON.stringify(s.init)}`);
  return s;
}

// -- version 0 -----------------------------------------------------------------------------

/** σ_l of §12.3 in float64: He sqrt(2/in) or Xavier sqrt(2/(in + out)). */
/** @param {Spec} spec @param {number} layer */
export function initStd(spec, layer) {
  const s = normalizeSpec(spec);
  const i = s.widths[layer], o = s.widths[layer + 1];
  return s.init === "he" ? Math.sqrt(2 / i) : Math.sqrt(2 / (i + o));
}

/**
 * Version 0 of `x128ss-ih12` (§12.3): layer l's W row-major from G(initSeed, l),
 * float32(z_k · σ_l); biases 0. `initSeed` is a Number (safe integer) or BigInt.
 * A model too big for one Float32Array (the extreme preset) is refused: check
 * its CRC layer by layer with Generator.normalInto and initStd instead.
 * @param {Spec} spec
 * @param {number | bigint} initSeed
 */
export function initParams(spec, initSeed) {
  const s = checkSpec(spec);
  const count = paramCount(s.widths);
  if (count > 2 ** 31) throw new RangeError(`initParams: ${count} parameters is too many to allocate`);
  const out = new Float32Array(count);
  for (const [l, { o, i, w }] of layersOf(s.widths).entries()) {
    new Generator(initSeed, l).normalInto(out, initStd(s, l), w, o * i);
  }
  return out;
}

// -- task fields ---------------------------------------------------------------------------

const OPT_DEFAULTS = Object.freeze({
  kind: "sgd", lr: 0.05, momentum: 0.9, nesterov: false, beta1: 0.9, beta2: 0.999, eps: 1e-8,
});

/**
 * The optimizer map of §12.5 with its defaults. Anything the client cannot
 * compute exactly as specified (an unknown key or kind, a value out of range)
 * throws an Error whose message starts with "optimizer:", so the caller can
 * decline the task rather than send a guessed update.
 * @param {Record<string, unknown> | null | undefined} map
 * @returns {Optimizer}
 */
export function parseOptimizer(map) {
  /** @type {Record<string, unknown>} the values as given, checked below */
  const opt = { ...OPT_DEFAULTS };
  for (const [key, value] of Object.entries(map ?? {})) {
    if (!Object.hasOwn(OPT_DEFAULTS, key)) throw new Error(`optimizer: unknown key ${JSON.stringify(key)}`);
    opt[key] = value;
  }
  if (opt.kind !== "sgd" && opt.kind !== "momentum" && opt.kind !== "adam") {
    throw new Error(`optimizer: unknown kind ${JSON.stringify(opt.kind)}`);
  }
  for (const key of ["lr", "momentum", "beta1", "beta2", "eps"]) {
    if (typeof opt[key] === "bigint") opt[key] = Number(opt[key]);
    if (typeof opt[key] !== "number" || !Number.isFinite(opt[key])) {
      throw new Error(`optimizer: ${key} must be a finite number, got ${String(opt[key])}`);
    }
  }
  if (typeof opt.nesterov !== "boolean") throw new Error(`optimizer: nesterov must be a bool, got ${String(opt.nesterov)}`);
  const checked = /** @type {Optimizer} every field checked above */ (opt);
  if (!(checked.lr > 0)) throw new Error(`optimizer: lr must be > 0, got ${checked.lr}`);
  if (!(checked.eps > 0)) throw new Error(`optimizer: eps must be > 0, got ${checked.eps}`);
  for (const key of /** @type {const} */ (["momentum", "beta1", "beta2"])) {
    if (!(checked[key] >= 0 && checked[key] < 1)) throw new Error(`optimizer: ${key} must be in [0, 1), got ${checked[key]}`);
  }
  return checked;
}

/** @param {TaskLike} task @param {"steps" | "batch"} key
 *  @param {number} dflt @param {number} lo @param {number} hi */
function intField(task, key, dflt, lo, hi) {
  /** @type {unknown} */
  let v = task[key] ?? dflt;
  if (typeof v === "bigint") v = Number(v);
  if (typeof v !== "number" || !Number.isInteger(v) || v < lo || v > hi) throw new Error(`task: ${key} must be an integer in [${lo}, ${hi}], got ${String(v)}`);
  return v;
}

/** @param {TaskLike} task @param {"temperature" | "distill_alpha"} key
 *  @param {number} dflt @param {number} lo @param {number} hi */
function numField(task, key, dflt, lo, hi) {
  const v = task[key] ?? dflt;
  if (typeof v !== "number" || !(v >= lo && v <= hi)) throw new Error(`task: ${key} must be a number in [${lo}, ${hi}], got ${String(v)}`);
  return v;
}

/** Checks the rows against the spec; returns {labels, targets} (one is null).
 *  @param {Rows} rows @param {FullSpec} spec
 *  @returns {{labels: Labels, targets: null} | {labels: null, targets: Float32Array}} */
function checkRows(rows, spec) {
  const { X, y, n, f } = rows;
  const t = rows.t ?? 0;
  const K = spec.widths[spec.widths.length - 1];
  if (!Number.isInteger(n) || n < 1) throw new Error(`rows: need at least one row, got n = ${n}`);
  if (f !== spec.widths[0]) throw new Error(`rows: ${f} features per row, the model's input width is ${spec.widths[0]}`);
  if (!(X instanceof Float32Array) || X.length < n * f) throw new Error(`rows: X must be a Float32Array of ${n}×${f}`);
  if (t === 0) {
    if (!y || y.length < n) throw new Error(`rows: need ${n} labels`);
    for (let r = 0; r < n; r++) {
      const v = y[r];
      if (!Number.isInteger(v) || v < 0 || v >= K) throw new Error(`rows: label ${v} of row ${r} is not in [0, ${K})`);
    }
    return { labels: y, targets: null };
  }
  if (spec.loss !== "mse") throw new Error("rows: softmax_ce needs integer class labels, got float targets");
  if (t !== K) throw new Error(`rows: ${t} targets per row, the model's output width is ${K}`);
  if (!(y instanceof Float32Array) || y.length < n * t) throw new Error(`rows: y must be a Float32Array of ${n}×${t}`);
  return { labels: null, targets: y };
}

// -- losses (§12.4, §12.6) on a feature-major output out[j·nb + r] ----------------------------

/**
 * softmax_ce over the nb rows of the output at net.A: returns the sum of the
 * rows' losses ln s + m − z_y and leaves D1 = (softmax − onehot)·scale. The
 * softmax itself is a kernel (its exps were most of a small model's loss);
 * `rowIndex[r]` is the task row of batch row r.
 */
/** @param {Net} net @param {number} nb @param {number} K @param {Labels} labels
 *  @param {Uint32Array} rowIndex @param {number} scale */
function ceLoss(net, nb, K, labels, rowIndex, scale) {
  const out = net.A, o0 = net.outOffset, D = net.D1, S = net.S;
  net.k.softmax(K, nb, out, o0, D, 0, scale, S, 0);
  let total = 0;
  for (let r = 0; r < nb; r++) {
    const y = labels[rowIndex[r]];
    total += Math.log(S[nb + r]) + S[r] - out[o0 + y * nb + r];
    D[y * nb + r] -= scale;
  }
  return total;
}

/**
 * mse over nb rows: returns the sum of squared errors and writes D = e·scale,
 * e = out − target in float32 as the reference computes it. Targets are the
 * float rows or the one-hot vectors of labels.
 */
/** @param {Float32Array} out @param {number} o0 @param {number} nb @param {number} K
 *  @param {Labels | null} labels @param {Float32Array | null} targets (one of the two)
 *  @param {Uint32Array} rowIndex @param {number} scale @param {Float32Array} D */
function mseGrad(out, o0, nb, K, labels, targets, rowIndex, scale, D) {
  let total = 0;
  for (let r = 0; r < nb; r++) {
    const t = rowIndex[r];
    for (let j = 0; j < K; j++) {
      const want = targets ? targets[t * K + j] : labels?.[t] === j ? 1 : 0;
      const e = Math.fround(out[o0 + j * nb + r] - want);
      total += e * e;
      D[j * nb + r] = e * scale;
    }
  }
  return total;
}

/**
 * The distillation loss of §12.6 over nb rows: returns the sum of the rows'
 * losses and writes D = (α·T·(q − p) + (1 − α)·(s − onehot))·scale.
 */
/** @param {Float32Array} out @param {number} o0 @param {number} nb @param {number} K
 *  @param {Labels} labels @param {Float32Array} teacher @param {Uint32Array} rowIndex
 *  @param {number} T @param {number} alpha @param {number} scale @param {Float32Array} D
 *  @param {Float64Array} sc */
function kdGrad(out, o0, nb, K, labels, teacher, rowIndex, T, alpha, scale, D, sc) {
  const invT = 1 / T;
  const ps = sc.subarray(0, K), pst = sc.subarray(K, 2 * K), ptt = sc.subarray(2 * K, 3 * K);
  let total = 0;
  for (let r = 0; r < nb; r++) {
    const t = rowIndex[r];
    let ms = out[o0 + r], mt = teacher[t * K];
    for (let j = 1; j < K; j++) {
      ms = Math.max(ms, out[o0 + j * nb + r]);
      mt = Math.max(mt, teacher[t * K + j]);
    }
    let s1 = 0, s2 = 0, s3 = 0;
    for (let j = 0; j < K; j++) {
      const z = out[o0 + j * nb + r] - ms;
      s1 += ps[j] = expd(z);
      s2 += pst[j] = expd(z * invT);
      s3 += ptt[j] = expd((teacher[t * K + j] - mt) * invT);
    }
    const y = labels[t];
    total += (1 - alpha) * (Math.log(s1) - (out[o0 + y * nb + r] - ms));
    let kl = 0;
    for (let j = 0; j < K; j++) {
      const p = ptt[j] / s3, q = pst[j] / s2;
      if (p > 0) kl += p * (Math.log(p) - Math.log(q));
      const g = alpha * T * (q - p) + (1 - alpha) * (ps[j] / s1 - (j === y ? 1 : 0));
      D[j * nb + r] = g * scale;
    }
    total += alpha * T * T * kl;
  }
  return total;
}

/** Index of the first largest of n values at a[a0 + k·stride]. */
/** @param {ArrayLike<number>} a @param {number} a0 @param {number} n @param {number} stride */
function argmax(a, a0, n, stride) {
  let best = 0, v = a[a0];
  for (let k = 1; k < n; k++) {
    if (a[a0 + k * stride] > v) {
      v = a[a0 + k * stride];
      best = k;
    }
  }
  return best;
}

// -- the network on a kernel set --------------------------------------------------------------

/**
 * A network's buffers in one workspace: params P, gradient G, optimizer
 * state, the input block both ways (XT [f, rows], XB [rows, f]), every layer's
 * output (A, feature-major, at aOff[l]), delta ping-pong D1/D2 and a transpose
 * scratch TR. `rows` is the most rows one block holds.
 */
class Net {
  /** @param {FullSpec} spec @param {Kernels} kernels @param {number} rows
   *  @param {{grad?: boolean, opt?: string | null}} [options] */
  constructor(spec, kernels, rows, { grad = false, opt = null } = {}) {
    this.k = kernels;
    this.spec = spec;
    this.layers = layersOf(spec.widths);
    this.acts = actCodes(spec);
    this.P = paramCount(spec.widths);
    this.rows = rows;
    const L = this.layers.length, f = spec.widths[0];
    this.aOff = [];
    let aSize = 0;
    for (const { o } of this.layers) {
      this.aOff.push(aSize);
      aSize += o * rows;
    }
    const widest = Math.max(...spec.widths.slice(1));
    const hidden = L > 1 ? Math.max(...spec.widths.slice(1, L)) : 0;
    /** @type {BufferName[]} */
    const names = ["params", "XT", "A", "D1", "S"];
    const sizes = [this.P, f * rows, aSize, widest * rows, 2 * rows];
    if (grad) {
      names.push("G", "XB", "D2", "TR");
      sizes.push(this.P, f * rows, widest * rows, hidden * rows);
    }
    if (opt === "momentum") names.push("V"), sizes.push(this.P);
    if (opt === "adam") names.push("M1", "M2"), sizes.push(this.P, this.P);
    this.names = names;
    this.ws = kernels.workspace(sizes);
    // The views, by name; a buffer this net does not have (no gradient, another
    // optimizer) is an empty array.
    this.params = EMPTY;
    this.XT = EMPTY;
    this.A = EMPTY;
    this.D1 = EMPTY;
    this.S = EMPTY;
    this.G = EMPTY;
    this.XB = EMPTY;
    this.D2 = EMPTY;
    this.TR = EMPTY;
    this.V = EMPTY;
    this.M1 = EMPTY;
    this.M2 = EMPTY;
    this.bind();
  }

  /** (Re-)acquires the views: after any other allocation in the same kernel memory. */
  bind() {
    const views = this.ws.views();
    for (let i = 0; i < this.names.length; i++) this[this.names[i]] = views[i];
  }

  free() {
    this.ws.free();
  }

  /** Copies nb rows of X (task rows rowIndex[0..nb)) into XT, and into XB when training. */
  /** @param {Float32Array} X @param {number} f @param {Uint32Array} rowIndex @param {number} nb */
  gather(X, f, rowIndex, nb) {
    const XT = this.XT, XB = this.XB;
    for (let r = 0; r < nb; r++) {
      const src = rowIndex[r] * f;
      for (let c = 0; c < f; c++) XT[c * nb + r] = X[src + c];
      if (XB.length) for (let c = 0; c < f; c++) XB[r * f + c] = X[src + c];
    }
  }

  /** Forward pass over the nb rows in XT; the output is A at outOffset, [K, nb]. */
  /** @param {number} nb */
  forward(nb) {
    const k = this.k, A = this.A;
    let prev = this.XT, prevOff = 0;
    for (let l = 0; l < this.layers.length; l++) {
      const { o, i, w, b } = this.layers[l];
      k.forwardGemm(o, i, nb, this.params, w, prev, prevOff, A, this.aOff[l]);
      k.biasAct(o, nb, A, this.aOff[l], this.params, b, this.acts[l]);
      prev = A;
      prevOff = this.aOff[l];
    }
  }

  get outOffset() {
    return this.aOff[this.aOff.length - 1];
  }

  /** Backpropagates dLoss/dout (D1, [K, nb]) into G; acc adds to G instead of writing it. */
  /** @param {number} nb @param {boolean} acc */
  backward(nb, acc) {
    const k = this.k, A = this.A, G = this.G;
    let cur = this.D1, other = this.D2;
    for (let l = this.layers.length - 1; l >= 0; l--) {
      const { o, i, w, b } = this.layers[l];
      k.actGrad(o * nb, cur, 0, A, this.aOff[l], this.acts[l]);
      let prev = this.XB;
      if (l > 0) {
        // dA of the layer below, from the old W: the optimizer runs after all layers.
        k.backwardGemm(o, i, nb, this.params, w, cur, 0, other, 0);
        k.transpose(i, nb, A, this.aOff[l - 1], this.TR, 0);
        prev = this.TR;
      }
      k.weightGemm(o, i, nb, cur, 0, prev, 0, G, w, acc);
      k.rowSums(o, nb, cur, 0, G, b, acc);
      const t = cur;
      cur = other;
      other = t;
    }
  }
}

// -- tasks --------------------------------------------------------------------------------

// A task dropped without close() (superseded, failed) would keep its wasm
// workspace, and with it every later allocation of the bump allocator; once
// the TaskRun is garbage, its workspace is freed here. close() is still the
// prompt way.
const reaper = typeof FinalizationRegistry === "function" ? new FinalizationRegistry((ws) => ws.free()) : null;

/**
 * A task in progress: call advance(maxSteps) until done, then result().
 * train / distill advance one optimizer step per unit; gradient and evaluate
 * run over their rows in units of `batch` rows (the cost of a train step).
 * `rowIndex` holds the task rows of the last step's batch (train, distill) or
 * the whole row list (gradient, evaluate): the tests check it against §12.2.
 */
class TaskRun {
  /** @param {TaskLike} task @param {Float32Array} start @param {Rows} rows @param {Kernels} kernels */
  constructor(task, start, rows, kernels) {
    const kind = task.kind ?? "train";
    if (!KINDS.has(kind)) throw new Error(`task: unknown kind ${JSON.stringify(kind)}`);
    const spec = checkSpec(task.spec);
    const P = paramCount(spec.widths);
    if (!(start instanceof Float32Array) || start.length !== P) {
      throw new Error(`task: the start model has ${start?.length} values, the spec needs ${P}`);
    }
    const { labels, targets } = checkRows(rows, spec);
    this.kind = kind;
    this.spec = spec;
    this.K = spec.widths[spec.widths.length - 1];
    this.X = rows.X;
    this.f = rows.f;
    this.n = rows.n;
    this.labels = labels;
    this.targets = targets;
    this.start = start;
    this.steps = intField(task, "steps", 1, 1, 1e9);
    this.batch = intField(task, "batch", 16, 1, 2 ** 20);
    this.seed = task.seed ?? 0;
    // a layer-split lower task: also return hidden layer `boundary`'s activations (§3.3.2)
    this.boundary = task.boundary ?? null;
    this.kernels = kernels;
    this.lossSum = 0;
    this.completed = 0; // units done: steps, or blocks of `batch` rows
    this.closed = false;
    /** @type {TaskResult | null} */
    this.cached = null;
    this.ex = new Float64Array(3 * this.K); // distillation's softmax scratch
    // train / distill: the optimizer and the row sampler (§12.2)
    /** @type {Optimizer | null} */
    this.opt = null;
    this.sampler = new Generator(this.seed, 0);
    this.perm = new Uint32Array(0);
    this.pos = 0;
    // distill (setupDistill)
    this.teacher = EMPTY;
    this.temperature = 1;
    this.alpha = 0;
    // gradient / evaluate: rows R, progress and correct guesses
    this.R = this.n;
    this.rowsDone = 0;
    this.correct = 0;

    if (kind === "train" || kind === "distill") {
      this.opt = parseOptimizer(task.optimizer);
      this.total = this.steps;
      this.rowIndex = new Uint32Array(this.batch);
      if (kind === "distill") this.setupDistill(task);
    } else {
      // gradient: the first min(steps·batch, n) rows of one permutation (§12.2);
      // evaluate: every row, in order.
      this.R = kind === "gradient" ? Math.min(this.steps * this.batch, this.n) : this.n;
      this.rowIndex =
        kind === "gradient"
          ? new Generator(this.seed, 0).permutation(this.n).subarray(0, this.R)
          : Uint32Array.from({ length: this.n }, (_, r) => r);
      this.total = Math.ceil(this.R / this.batch);
    }
    const opt = this.opt?.kind ?? null;
    // A gradient sums over its rows in blocks of exactly `batch` rows, so the
    // float32 sums, and the update, do not depend on how advance() is sliced.
    // Evaluate may take bigger blocks: a row's outputs do not depend on its block.
    let blockRows = this.batch;
    if (kind === "gradient") blockRows = Math.min(this.R, this.batch);
    if (kind === "evaluate") blockRows = Math.min(this.R, Math.max(this.batch, BLOCK_ROWS));
    this.net = new Net(spec, kernels, blockRows, { grad: kind !== "evaluate", opt });
    this.net.params.set(start);
    reaper?.register(this, this.net.ws, this);
  }

  /** The class labels: softmax_ce and distill tasks have them (checkRows). */
  get classLabels() {
    if (this.labels === null) throw new Error("task: needs integer class labels");
    return this.labels;
  }

  /** @param {TaskLike} task */
  setupDistill(task) {
    if (this.spec.loss !== "softmax_ce") throw new Error(`task: distillation needs a softmax_ce model, got ${this.spec.loss}`);
    if (!this.labels) throw new Error("task: distillation needs integer labels");
    const tl = task.teacher_logits;
    const shape = tl?.shape ?? [];
    if (!tl || !(tl.data instanceof Float32Array) || shape.length !== 2 || shape[0] !== this.n || shape[1] !== this.K || tl.data.length !== this.n * this.K) {
      throw new Error(`task: teacher_logits must be [${this.n}, ${this.K}], got ${tl ? JSON.stringify(shape) : "none"}`);
    }
    for (const v of tl.data) if (!Number.isFinite(v)) throw new Error("task: teacher_logits are not finite");
    this.teacher = tl.data;
    this.temperature = numField(task, "temperature", 4.0, 0.001, 1000);
    this.alpha = numField(task, "distill_alpha", 0.7, 0, 1);
  }

  get done() {
    return this.completed >= this.total;
  }

  /** Runs at most maxSteps units; returns how many it ran (0 once done). */
  advance(maxSteps = Infinity) {
    if (this.closed) throw new Error("task: advance() after close()");
    const units = Math.min(Math.floor(maxSteps), this.total - this.completed);
    if (!(units > 0)) return 0;
    this.net.bind();
    if (this.kind === "train" || this.kind === "distill") {
      for (let s = 0; s < units; s++) this.trainStep(this.completed + s + 1);
    } else {
      const end = Math.min(this.R, this.rowsDone + units * this.batch);
      while (this.rowsDone < end) {
        const nb = Math.min(this.net.rows, end - this.rowsDone);
        this.block(this.rowsDone, nb);
        this.rowsDone += nb;
      }
    }
    this.completed += units;
    return units;
  }

  /** The next row of the task's row sequence: consecutive permutations (§12.2). */
  nextRow() {
    if (this.pos === this.perm.length) {
      this.perm = this.sampler.permutation(this.n);
      this.pos = 0;
    }
    return this.perm[this.pos++];
  }

  /** Optimizer step t (from 1) of the task. */
  /** @param {number} t */
  trainStep(t) {
    const net = this.net, B = this.batch, K = this.K;
    for (let r = 0; r < B; r++) this.rowIndex[r] = this.nextRow();
    net.gather(this.X, this.f, this.rowIndex, B);
    net.forward(B);
    const out = net.A, o0 = net.outOffset;
    if (this.kind === "distill") {
      this.lossSum += kdGrad(out, o0, B, K, this.classLabels, this.teacher, this.rowIndex, this.temperature, this.alpha, 1 / B, net.D1, this.ex) / B;
    } else if (this.spec.loss === "mse") {
      this.lossSum += mseGrad(out, o0, B, K, this.labels, this.targets, this.rowIndex, 2 / (B * K), net.D1) / (B * K);
    } else {
      this.lossSum += ceLoss(net, B, K, this.classLabels, this.rowIndex, 1 / B) / B;
    }
    net.backward(B, false);
    const o = this.opt, k = net.k, P = net.P;
    if (o === null) throw new Error(`task: a ${this.kind} task has no optimizer`);
    if (o.kind === "sgd") {
      k.sgd(P, net.params, net.G, o.lr);
    } else if (o.kind === "momentum") {
      k.momentum(P, net.params, net.G, net.V, o.lr, o.momentum, o.nesterov);
    } else {
      k.adam(P, net.params, net.G, net.M1, net.M2, o.beta1, o.beta2, o.eps, o.lr / (1 - o.beta1 ** t), Math.sqrt(1 - o.beta2 ** t));
    }
  }

  /** gradient / evaluate: nb rows from position `from` of the row list. */
  /** @param {number} from @param {number} nb */
  block(from, nb) {
    const net = this.net, K = this.K;
    const idx = this.rowIndex.subarray(from, from + nb);
    net.gather(this.X, this.f, idx, nb);
    net.forward(nb);
    const out = net.A, o0 = net.outOffset;
    if (this.kind === "gradient") {
      const R = this.R;
      this.lossSum +=
        this.spec.loss === "mse"
          ? mseGrad(out, o0, nb, K, this.labels, this.targets, idx, 2 / (R * K), net.D1)
          : ceLoss(net, nb, K, this.classLabels, idx, 1 / R);
      net.backward(nb, from > 0);
      return;
    }
    // evaluate: the loss in float64 from the float32 outputs, and accuracy.
    // ceLoss's D1 (the gradient) goes unused: evaluate never runs backward.
    for (let r = 0; r < nb; r++) {
      const t = idx[r];
      const guess = argmax(out, o0 + r, K, nb);
      if (this.spec.loss === "mse") {
        for (let j = 0; j < K; j++) {
          const want = this.targets ? this.targets[t * K + j] : this.classLabels[t] === j ? 1 : 0;
          const e = out[o0 + j * nb + r] - want;
          this.lossSum += e * e;
        }
        const truth = this.targets ? argmax(this.targets, t * K, K, 1) : this.classLabels[t];
        if (guess === truth) this.correct++;
      } else if (guess === this.classLabels[t]) {
        this.correct++;
      }
    }
    if (this.spec.loss === "softmax_ce") this.lossSum += ceLoss(net, nb, K, this.classLabels, idx, 1);
  }

  /**
   * {update, loss, samples, steps, metrics} of §12.7, once done; the update is a
   * fresh Float32Array (null for evaluate). Frees the task's buffers.
   */
  result() {
    if (this.cached) return this.cached;
    if (!this.done) throw new Error(`task: result() before done (${this.completed} of ${this.total})`);
    if (this.closed) throw new Error("task: result() after close()");
    const net = this.net;
    net.bind();
    /** @type {TaskResult} */
    let res;
    if (this.kind === "train" || this.kind === "distill") {
      const P = net.P, p = net.params, start = this.start;
      const update = new Float32Array(P);
      for (let k = 0; k < P; k++) update[k] = p[k] - start[k];
      res = { update, loss: this.lossSum / this.steps, samples: this.steps * this.batch, steps: this.steps, metrics: {} };
      if (this.boundary !== null) {
        // a copy first: the forward pass allocates, which may move a wasm memory under p
        const trained = p.slice();
        res.boundary = boundaryOf(this.spec, trained, this.boundary, this.X, this.n, this.kernels);
      }
    } else if (this.kind === "gradient") {
      const denom = this.spec.loss === "mse" ? this.R * this.K : this.R;
      res = { update: net.G.slice(), loss: this.lossSum / denom, samples: this.R, steps: 1, metrics: {} };
    } else {
      const denom = this.spec.loss === "mse" ? this.n * this.K : this.n;
      res = { update: null, loss: this.lossSum / denom, samples: this.n, steps: 0, metrics: { accuracy: this.correct / this.n } };
    }
    this.close();
    this.cached = res;
    return res;
  }

  /** Frees the task's buffers (result() does it too); the task cannot go on. */
  close() {
    if (this.closed) return;
    this.closed = true;
    reaper?.unregister(this);
    this.net.free();
  }
}

/**
 * Starts a task (the decoded `task` map, §3.3 defaults for missing keys) from
 * the `start` parameters (left unchanged) on the task's rows
 * `{X, y, n, f, t}` (t = 0: integer labels in y). Returns the TaskRun:
 * `done`, `advance(maxSteps) → steps run`, `result()`, `close()`, and
 * `completed` / `total` units for progress.
 * @param {TaskLike} task @param {Float32Array} start @param {Rows} rows @param {Kernels} [kernels]
 */
export function startTask(task, start, rows, kernels = jsKernels) {
  return new TaskRun(task, start, rows, kernels);
}

/** The activations of hidden layer `cut` (n × width, row-major) for n rows of X
 *  under `params`: its first `cut` layers' forward pass (§3.3.2, §12.7).
 *  @param {Spec} spec @param {Float32Array} params @param {number} cut @param {Float32Array} X
 *  @param {number} n @param {Kernels} [kernels] */
export function boundaryOf(spec, params, cut, X, n, kernels = jsKernels) {
  const s = checkSpec(spec);
  if (!(cut >= 1 && cut < s.widths.length - 1)) throw new Error(`boundary: hidden layer ${cut} is not in the spec`);
  const widths = s.widths.slice(0, cut + 1);
  const block = { ...s, widths, activations: s.activations.slice(0, cut) };
  return predict(block, params.subarray(0, paramCount(widths)), X, n, kernels);
}

/** Raw outputs (n × out, row-major) of the network for n rows of X (n × in).
 *  @param {Spec} spec @param {Float32Array} params @param {Float32Array} X @param {number} n
 *  @param {Kernels} [kernels] */
export function predict(spec, params, X, n, kernels = jsKernels) {
  const s = checkSpec(spec);
  const f = s.widths[0], K = s.widths[s.widths.length - 1];
  if (!(params instanceof Float32Array) || params.length !== paramCount(s.widths)) {
    throw new Error(`predict: params have ${params?.length} values, the spec needs ${paramCount(s.widths)}`);
  }
  if (X.length < n * f) throw new Error(`predict: X holds fewer than ${n}×${f} values`);
  const result = new Float32Array(n * K);
  if (n === 0) return result;
  const net = new Net(s, kernels, Math.min(n, BLOCK_ROWS));
  try {
    net.params.set(params);
    const idx = new Uint32Array(net.rows);
    for (let from = 0; from < n; from += net.rows) {
      const nb = Math.min(net.rows, n - from);
      for (let r = 0; r < nb; r++) idx[r] = from + r;
      net.gather(X, f, idx, nb);
      net.forward(nb);
      const o0 = net.outOffset;
      for (let r = 0; r < nb; r++) {
        for (let j = 0; j < K; j++) result[(from + r) * K + j] = net.A[o0 + j * nb + r];
      }
    }
  } finally {
    net.free();
  }
  return result;
}
