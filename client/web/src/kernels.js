// The arithmetic kernels of src/nn.js: a plain JavaScript set and a WebAssembly
// SIMD set (wasm/kernels.c → static/kernels.wasm) with the same interface.
//
// Interface. Every buffer a kernel touches comes from `kernels.workspace(sizes)`,
// which for the wasm set lives inside the module's memory, so a call passes
// pointers and never copies. Arrays are passed as (Float32Array, offset in
// floats) pairs; offsets rather than subarrays keep the per-call cost at zero
// allocations. Layouts are nn.js's: every layer's activations and deltas are
// feature-major [width, batch], so the three products of a train step are all
//
//   C[m, n] (+)= sum_k A[a0 + m·sam + k·sak] · B[b0 + k·ldb + n]     (gemm)
//
// with B and C contiguous along n, which is the shape a broadcast-A SIMD kernel
// wants. The named variants below spell out the three uses.
//
// Members of a kernel set:
//   name                     "js" or "wasm-simd" (KERNEL_FAMILY: its hello.kernel)
//   workspace(sizes)         → { views(), free() }: one allocation holding a
//                            zeroed Float32Array of each size. views() returns the arrays;
//                            call it again after anything else may have allocated
//                            (a wasm memory that grows detaches older views).
//   gemm(M, N, K, A, a0, sam, sak, B, b0, ldb, C, c0, ldc, acc)
//   forwardGemm(o, i, nb, W, w0, X, x0, Z, z0)      Zᵀ[o,nb] = W[o,i]·Xᵀ[i,nb]  (X·Wᵀ)
//   backwardGemm(o, i, nb, W, w0, D, d0, G, g0)     Gᵀ[i,nb] = W[o,i]ᵀ·Dᵀ[o,nb] (dZ·W)
//   weightGemm(o, i, nb, D, d0, X, x0, G, g0, acc)  G[o,i] (+)= Dᵀ[o,nb]·X[nb,i] (dZᵀ·X)
//   biasAct(rows, cols, Z, z0, b, b0, act)          Z[r,c] = act(Z[r,c] + b[r])
//   actGrad(n, D, d0, A, a0, act)                   D[k] *= act'(A[k]), A the output
//   rowSums(rows, cols, D, d0, out, o0, acc)        out[r] (+)= sum_c D[r,c]
//   softmax(K, nb, Z, z0, D, d0, scale, S, s0)      per column r of Z [K, nb]: m = max_j Z[j,r],
//                                                   s = sum_j e^(Z[j,r] − m), D[j,r] = e^(Z − m)/s·scale,
//                                                   S[s0 + r] = m, S[s0 + nb + r] = s
//   transpose(rows, cols, S, s0, T, t0)             T[c,r] = S[r,c]
//   sgd(n, p, g, lr); momentum(n, p, g, v, lr, mu, nesterov);
//   adam(n, p, g, m, v, b1, b2, eps, step, bc2)     §12.5 on arrays from index 0, in float64
//                                                   (wasm sgd: float32, as the reference's own
//                                                   fused sgemm); step = lr/(1−β₁ᵗ), bc2 = sqrt(1−β₂ᵗ)
// `act` is a code of ACT: identity 0, relu 1, tanh 2, sigmoid 3.

const POW2 = Float64Array.from({ length: 2098 }, (_, k) => 2 ** (k - 1074)); // 2^-1074 … 2^1023
const POW2_16 = Float64Array.from({ length: 16 }, (_, i) => 2 ** (i / 16));

/**
 * e^x in float64 to within 1e-15 relative (the JS softmax, distillation).
 * V8's Math.exp is a call of ~25 ns, which made the softmax a third of a small
 * model's train step; this one is inlined: x = (16e + i)·ln2/16 + r with
 * |r| <= ln2/32, e^r by Taylor to r^6 (the next term is below 2^-50), times
 * 2^(i/16) and 2^e from tables.
 */
/** @param {number} x */
export function expd(x) {
  if (!(x > -745.2)) return x !== x ? x : 0;
  if (x > 709.782712893384) return Infinity; // ln(MAX_VALUE)
  const k = Math.round(x * 23.083120654223414); // 16 / ln 2
  // ln2/16 split in two: k times the high part is exact.
  const r = x - k * 0.04332169877307024 - k * 1.1926343307941173e-11;
  const p = 1 + r * (1 + r * (0.5 + r * (1 / 6 + r * (1 / 24 + r * (1 / 120 + r / 720)))));
  const e = k >> 4;
  // At the ends (a subnormal result; e = 1024 just below overflow) scale in two
  // steps, so that 2^e stays a finite, normal table entry.
  if (e < -1022) return p * POW2_16[k & 15] * POW2[e + 64 + 1074] * 5.421010862427522e-20;
  if (e > 1023) return p * POW2_16[k & 15] * POW2[e - 64 + 1074] * 18446744073709551616;
  return p * POW2_16[k & 15] * POW2[e + 1074];
}

/** Activation codes shared with wasm/kernels.c. */
export const ACT = Object.freeze({ identity: 0, relu: 1, tanh: 2, sigmoid: 3 });

const RELU = 1, TANH = 2, SIGMOID = 3;

/** One allocation of zeroed Float32Arrays (see `workspace` above).
 *  @typedef {{views(): Float32Array[], free(): void}} Workspace */
/** The members a kernel set implements (see above); the named products follow.
 *  @typedef {object} BaseKernels
 *  @property {string} name
 *  @property {(sizes: number[]) => Workspace} workspace
 *  @property {(M: number, N: number, K: number, A: Float32Array, a0: number, sam: number, sak: number,
 *    B: Float32Array, b0: number, ldb: number, C: Float32Array, c0: number, ldc: number, acc: boolean) => void} gemm
 *  @property {(rows: number, cols: number, Z: Float32Array, z0: number, b: Float32Array, b0: number, act: number) => void} biasAct
 *  @property {(n: number, D: Float32Array, d0: number, A: Float32Array, a0: number, act: number) => void} actGrad
 *  @property {(rows: number, cols: number, D: Float32Array, d0: number, out: Float32Array, o0: number, acc: boolean) => void} rowSums
 *  @property {(K: number, nb: number, Z: Float32Array, z0: number, D: Float32Array, d0: number, scale: number,
 *    S: Float32Array, s0: number) => void} softmax
 *  @property {(rows: number, cols: number, S: Float32Array, s0: number, T: Float32Array, t0: number) => void} transpose
 *  @property {(n: number, p: Float32Array, g: Float32Array, lr: number) => void} sgd
 *  @property {(n: number, p: Float32Array, g: Float32Array, vel: Float32Array, lr: number, mu: number,
 *    nesterov: boolean) => void} momentum
 *  @property {(n: number, p: Float32Array, g: Float32Array, m1: Float32Array, m2: Float32Array, b1: number,
 *    b2: number, eps: number, step: number, bc2: number) => void} adam
 */
/** @typedef {(o: number, i: number, nb: number, W: Float32Array, w0: number, X: Float32Array, x0: number,
 *    Z: Float32Array, z0: number) => void} Product */
/** A kernel set: nn.js's arithmetic.
 *  @typedef {BaseKernels & {forwardGemm: Product, backwardGemm: Product,
 *    weightGemm: (o: number, i: number, nb: number, D: Float32Array, d0: number, X: Float32Array, x0: number,
 *      G: Float32Array, g0: number, acc: boolean) => void}} Kernels */

/** The named products, in terms of gemm (the same for both sets).
 *  @template {BaseKernels} K
 *  @param {K} k
 *  @returns {K & Kernels} */
function addGemmVariants(k) {
  return Object.assign(k, {
    /** @type {Product} */
    forwardGemm: (o, i, nb, W, w0, X, x0, Z, z0) => k.gemm(o, nb, i, W, w0, i, 1, X, x0, nb, Z, z0, nb, false),
    /** @type {Product} */
    backwardGemm: (o, i, nb, W, w0, D, d0, G, g0) => k.gemm(i, nb, o, W, w0, 1, i, D, d0, nb, G, g0, nb, false),
    /** @type {Kernels["weightGemm"]} */
    weightGemm: (o, i, nb, D, d0, X, x0, G, g0, acc) => k.gemm(o, i, nb, D, d0, nb, 1, X, x0, i, G, g0, i, acc),
  });
}

// -- plain JavaScript ------------------------------------------------------------------

/** @type {BaseKernels["gemm"]} */
const jsGemm = (M, N, K, A, a0, sam, sak, B, b0, ldb, C, c0, ldc, acc) => {
  // Two rows by four columns per pass, summed in eight float64 locals that the
  // JIT keeps in registers (1.6× the speed of one row; three rows spill); the
  // B loads are contiguous. Then an odd last row, and N's last N mod 4 columns.
  const N4 = N - (N % 4);
  let m = 0;
  for (; m + 2 <= M; m += 2) {
    const am = a0 + m * sam;
    const cm = c0 + m * ldc;
    for (let n = 0; n < N4; n += 4) {
      let s0 = 0, s1 = 0, s2 = 0, s3 = 0, t0 = 0, t1 = 0, t2 = 0, t3 = 0;
      let ap = am, bp = b0 + n;
      for (let k = 0; k < K; k++) {
        const a = A[ap], b = A[ap + sam];
        const x0 = B[bp], x1 = B[bp + 1], x2 = B[bp + 2], x3 = B[bp + 3];
        s0 += a * x0; s1 += a * x1; s2 += a * x2; s3 += a * x3;
        t0 += b * x0; t1 += b * x1; t2 += b * x2; t3 += b * x3;
        ap += sak;
        bp += ldb;
      }
      const c = cm + n, d = c + ldc;
      if (acc) {
        C[c] += s0; C[c + 1] += s1; C[c + 2] += s2; C[c + 3] += s3;
        C[d] += t0; C[d + 1] += t1; C[d + 2] += t2; C[d + 3] += t3;
      } else {
        C[c] = s0; C[c + 1] = s1; C[c + 2] = s2; C[c + 3] = s3;
        C[d] = t0; C[d + 1] = t1; C[d + 2] = t2; C[d + 3] = t3;
      }
    }
  }
  if (m < M) {
    const am = a0 + m * sam;
    const cm = c0 + m * ldc;
    for (let n = 0; n < N4; n += 4) {
      let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      let ap = am, bp = b0 + n;
      for (let k = 0; k < K; k++) {
        const a = A[ap];
        s0 += a * B[bp]; s1 += a * B[bp + 1]; s2 += a * B[bp + 2]; s3 += a * B[bp + 3];
        ap += sak;
        bp += ldb;
      }
      const c = cm + n;
      if (acc) {
        C[c] += s0; C[c + 1] += s1; C[c + 2] += s2; C[c + 3] += s3;
      } else {
        C[c] = s0; C[c + 1] = s1; C[c + 2] = s2; C[c + 3] = s3;
      }
    }
  }
  for (let n = N4; n < N; n++) {
    for (let r = 0; r < M; r++) {
      let s = 0, ap = a0 + r * sam, bp = b0 + n;
      for (let k = 0; k < K; k++) {
        s += A[ap] * B[bp];
        ap += sak;
        bp += ldb;
      }
      const c = c0 + r * ldc + n;
      C[c] = acc ? C[c] + s : s;
    }
  }
};

/** @param {number} z @param {number} act */
function jsActivate(z, act) {
  if (act === RELU) return z > 0 ? z : 0;
  if (act === TANH) return Math.tanh(z);
  if (act === SIGMOID) return 1 / (1 + Math.exp(-z));
  return z;
}

/** hello.kernel (docs/protocol.md §3.1) of each kernel set, by its name: the §12
 *  kernel family, bit-exact with itself (plain JS sums in float64, the WASM SIMD
 *  set in float32 in its own order), which a replicating server pairs twins by. */
export const KERNEL_FAMILY = Object.freeze({ js: "js-f64", "wasm-simd": "wasm-simd-f32" });

/** The kernels in plain JavaScript: the fallback where WebAssembly SIMD is missing. */
export const jsKernels = addGemmVariants(/** @satisfies {BaseKernels} */ ({
  name: "js",
  workspace(sizes) {
    const views = sizes.map((n) => new Float32Array(n));
    return { views: () => views, free() {} };
  },
  gemm: jsGemm,
  biasAct(rows, cols, Z, z0, b, b0, act) {
    for (let r = 0; r < rows; r++) {
      // The bias add rounds to float32, as the reference's float32 arrays do.
      const br = b[b0 + r];
      const zr = z0 + r * cols;
      for (let c = zr; c < zr + cols; c++) Z[c] = jsActivate(Math.fround(Z[c] + br), act);
    }
  },
  actGrad(n, D, d0, A, a0, act) {
    if (act === RELU) {
      for (let k = 0; k < n; k++) if (!(A[a0 + k] > 0)) D[d0 + k] = 0;
    } else if (act === TANH) {
      for (let k = 0; k < n; k++) {
        const a = A[a0 + k];
        D[d0 + k] *= 1 - a * a;
      }
    } else if (act === SIGMOID) {
      for (let k = 0; k < n; k++) {
        const a = A[a0 + k];
        D[d0 + k] *= a * (1 - a);
      }
    }
  },
  rowSums(rows, cols, D, d0, out, o0, acc) {
    for (let r = 0; r < rows; r++) {
      let s = 0;
      const dr = d0 + r * cols;
      for (let c = dr; c < dr + cols; c++) s += D[c];
      out[o0 + r] = acc ? out[o0 + r] + s : s;
    }
  },
  softmax(K, nb, Z, z0, D, d0, scale, S, s0) {
    for (let r = 0; r < nb; r++) {
      let m = Z[z0 + r];
      for (let j = 1; j < K; j++) if (Z[z0 + j * nb + r] > m) m = Z[z0 + j * nb + r];
      let s = 0;
      for (let j = 0; j < K; j++) s += D[d0 + j * nb + r] = expd(Z[z0 + j * nb + r] - m);
      const inv = scale / s;
      for (let j = 0; j < K; j++) D[d0 + j * nb + r] *= inv;
      S[s0 + r] = m;
      S[s0 + nb + r] = s;
    }
  },
  transpose(rows, cols, S, s0, T, t0) {
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) T[t0 + c * rows + r] = S[s0 + r * cols + c];
    }
  },
  sgd(n, p, g, lr) {
    for (let k = 0; k < n; k++) p[k] -= lr * g[k];
  },
  momentum(n, p, g, vel, lr, mu, nesterov) {
    for (let k = 0; k < n; k++) {
      const gk = g[k];
      const v = mu * vel[k] + gk;
      vel[k] = v;
      p[k] -= lr * (nesterov ? gk + mu * v : v);
    }
  },
  adam(n, p, g, m1, m2, b1, b2, eps, step, bc2) {
    for (let k = 0; k < n; k++) {
      const gk = g[k];
      const m = b1 * m1[k] + (1 - b1) * gk;
      const v = b2 * m2[k] + (1 - b2) * gk * gk;
      m1[k] = m;
      m2[k] = v;
      p[k] -= (step * m) / (Math.sqrt(v) / bc2 + eps);
    }
  },
}));

// -- WebAssembly SIMD --------------------------------------------------------------------

/** Whether this engine validates WebAssembly SIMD (a v128 constant in a tiny module). */
export function wasmSimdSupported() {
  try {
    // (module (func (result v128) v128.const i32x4 0 0 0 0))
    const bytes = new Uint8Array([
      0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 22, 1, 20, 0, 253,
      12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11,
    ]);
    return typeof WebAssembly === "object" && WebAssembly.validate(bytes);
  } catch {
    return false;
  }
}

const ALIGN = 64; // as wasm/kernels.c: every buffer starts on a cache line

/** What wasm/kernels.c exports (pointers are byte addresses, flags 0 or 1).
 *  @typedef {object} WasmExports
 *  @property {WebAssembly.Memory} memory
 *  @property {(bytes: number) => number} cg_alloc
 *  @property {(addr: number) => void} cg_release
 *  @property {(M: number, N: number, K: number, A: number, sam: number, sak: number, B: number, ldb: number,
 *    C: number, ldc: number, acc: number) => void} cg_gemm
 *  @property {(rows: number, cols: number, Z: number, b: number, act: number) => void} cg_bias_act
 *  @property {(n: number, D: number, A: number, act: number) => void} cg_act_grad
 *  @property {(rows: number, cols: number, D: number, out: number, acc: number) => void} cg_row_sums
 *  @property {(K: number, nb: number, Z: number, D: number, scale: number, S: number) => void} cg_softmax
 *  @property {(rows: number, cols: number, S: number, T: number) => void} cg_transpose
 *  @property {(n: number, p: number, g: number, lr: number) => void} cg_sgd
 *  @property {(n: number, p: number, g: number, v: number, lr: number, mu: number, nesterov: number) => void} cg_momentum
 *  @property {(n: number, p: number, g: number, m1: number, m2: number, b1: number, b2: number, eps: number,
 *    step: number, bc2: number) => void} cg_adam
 */
/** A workspace view of wasm memory, carrying its byte address.
 *  @typedef {Float32Array & {wasmAddr?: number}} WasmView */

/**
 * The WebAssembly SIMD kernels, from the bytes of static/kernels.wasm (an
 * ArrayBuffer or view), a fetch Response (or a promise of one), or a compiled
 * WebAssembly.Module. Rejects where the engine has no WebAssembly SIMD (test
 * wasmSimdSupported() first, or catch): jsKernels is the fallback.
 * @param {BufferSource | Response | WebAssembly.Module | Promise<BufferSource | Response | WebAssembly.Module>} source
 * @returns {Promise<Kernels & {memory: WebAssembly.Memory}>}
 */
export async function loadWasmKernels(source) {
  const src = await source;
  let instance;
  if (src instanceof WebAssembly.Module) {
    instance = await WebAssembly.instantiate(src, {});
  } else if (typeof Response !== "undefined" && src instanceof Response) {
    if (!src.ok) throw new Error(`kernels.wasm: HTTP ${src.status}`);
    instance = (await WebAssembly.instantiate(await src.arrayBuffer(), {})).instance;
  } else if (src instanceof ArrayBuffer || ArrayBuffer.isView(src)) {
    instance = (await WebAssembly.instantiate(src, {})).instance;
  } else {
    throw new TypeError("kernels.wasm: expected bytes, a Response or a WebAssembly.Module");
  }
  // The exports wasm/kernels.c declares (the module is ours, built with it).
  const x = /** @type {WasmExports} */ (/** @type {unknown} */ (instance.exports));
  const memory = x.memory;

  // Byte address of (view, offset in floats). Workspace views carry their address
  // as an own property `wasmAddr`: reading it is far cheaper than the `buffer` and
  // `byteOffset` getters (a tiny model's step makes ~30 calls), and it stays
  // right after the memory grows, since growth moves no data. Any other array
  // would make the kernel read whatever lies at some address: refuse it.
  /** @param {WasmView} view @param {number} off */
  function ptr(view, off) {
    const addr = view.wasmAddr;
    if (addr === undefined) throw new Error("kernels: array is not a wasm workspace view");
    return addr + 4 * off;
  }

  // cg_alloc is a bump allocator: blocks are freed in any order but their space
  // comes back only once every later block is gone too (nn.js frees in LIFO order
  // in practice: a task's workspace, or a predict() inside a task's life).
  /** @type {{addr: number, live: boolean}[]} */
  const blocks = []; // in address order
  function release() {
    for (let last = blocks.at(-1); last !== undefined && !last.live; last = blocks.at(-1)) {
      blocks.pop();
      x.cg_release(last.addr);
    }
  }

  return addGemmVariants(/** @satisfies {BaseKernels & {memory: WebAssembly.Memory}} */ ({
    name: "wasm-simd",
    memory,
    workspace(sizes) {
      /** @type {number[]} */
      const offsets = [];
      let bytes = 0;
      for (const n of sizes) {
        if (!Number.isInteger(n) || n < 0) throw new RangeError(`workspace: bad size ${n}`);
        offsets.push(bytes);
        bytes += Math.ceil((4 * n) / ALIGN) * ALIGN;
      }
      const addr = bytes > 0xffffffff ? 0 : x.cg_alloc(bytes) >>> 0;
      if (addr === 0) throw new RangeError(`workspace: cannot allocate ${bytes} bytes of wasm memory`);
      // Zeroed like a new Float32Array: the bump allocator hands back freed
      // space, and optimizer state must start at zero (§12.5).
      new Uint8Array(memory.buffer, addr, bytes).fill(0);
      const block = { addr, live: true };
      blocks.push(block);
      /** @type {ArrayBufferLike | null} */
      let buffer = null;
      /** @type {WasmView[]} */
      let views = [];
      return {
        views() {
          if (!block.live) throw new Error("workspace: used after free()");
          if (buffer !== memory.buffer) {
            buffer = memory.buffer;
            const now = memory.buffer;
            views = sizes.map((n, i) => {
              /** @type {WasmView} */
              const v = new Float32Array(now, addr + offsets[i], n);
              v.wasmAddr = addr + offsets[i];
              return v;
            });
          }
          return views;
        },
        free() {
          if (!block.live) return;
          block.live = false;
          views = [];
          buffer = null;
          release();
        },
      };
    },
    gemm(M, N, K, A, a0, sam, sak, B, b0, ldb, C, c0, ldc, acc) {
      x.cg_gemm(M, N, K, ptr(A, a0), sam, sak, ptr(B, b0), ldb, ptr(C, c0), ldc, acc ? 1 : 0);
    },
    biasAct(rows, cols, Z, z0, b, b0, act) {
      x.cg_bias_act(rows, cols, ptr(Z, z0), ptr(b, b0), act);
    },
    actGrad(n, D, d0, A, a0, act) {
      x.cg_act_grad(n, ptr(D, d0), ptr(A, a0), act);
    },
    rowSums(rows, cols, D, d0, out, o0, acc) {
      x.cg_row_sums(rows, cols, ptr(D, d0), ptr(out, o0), acc ? 1 : 0);
    },
    softmax(K, nb, Z, z0, D, d0, scale, S, s0) {
      x.cg_softmax(K, nb, ptr(Z, z0), ptr(D, d0), scale, ptr(S, s0));
    },
    transpose(rows, cols, S, s0, T, t0) {
      x.cg_transpose(rows, cols, ptr(S, s0), ptr(T, t0));
    },
    sgd(n, p, g, lr) {
      x.cg_sgd(n, ptr(p, 0), ptr(g, 0), lr);
    },
    momentum(n, p, g, vel, lr, mu, nesterov) {
      x.cg_momentum(n, ptr(p, 0), ptr(g, 0), ptr(vel, 0), lr, mu, nesterov ? 1 : 0);
    },
    adam(n, p, g, m1, m2, b1, b2, eps, step, bc2) {
      x.cg_adam(n, ptr(p, 0), ptr(g, 0), ptr(m1, 0), ptr(m2, 0), b1, b2, eps, step, bc2);
    },
  }));
}
