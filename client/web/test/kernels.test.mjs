// Both kernel sets against naive float64 loops, over the ragged shapes the
// blocked and SIMD paths treat separately (rows mod 4, columns mod 8 and 4).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Generator } from "../src/rng.js";
import { ACT, jsKernels, loadWasmKernels, wasmSimdSupported } from "../src/kernels.js";

const wasmKernels = await loadWasmKernels(readFileSync(new URL("../static/kernels.wasm", import.meta.url)));
const KERNELS = [jsKernels, wasmKernels];
const g = new Generator(77, 1);

/** A workspace of the given sizes, filled with normals. */
function filled(k, sizes, scale = 1) {
  const ws = k.workspace(sizes);
  for (const v of ws.views()) g.normalInto(v, scale);
  return ws;
}

function close(got, want, what, atol = 1e-5, rtol = 1e-5) {
  for (let i = 0; i < want.length; i++) {
    assert.ok(Math.abs(got[i] - want[i]) <= atol + rtol * Math.abs(want[i]), `${what}[${i}]: ${got[i]} vs ${want[i]}`);
  }
}

test("wasm SIMD is detected and the module names itself", () => {
  assert.equal(wasmSimdSupported(), true);
  assert.equal(wasmKernels.name, "wasm-simd");
  assert.equal(jsKernels.name, "js");
});

for (const k of KERNELS) {
  test(`${k.name}: gemm over ragged shapes and strides, write and accumulate`, () => {
    for (const M of [1, 3, 4, 5, 9]) {
      for (const N of [1, 3, 4, 7, 8, 9, 16, 21]) {
        for (const K of [1, 2, 5]) {
          for (const transA of [false, true]) {
            const [sam, sak] = transA ? [1, M] : [K, 1];
            const ldb = N + 2, ldc = N + 1; // padded rows: strides are honoured
            const ws = filled(k, [M * K + 3, K * ldb + 3, M * ldc + 3]);
            const [A, B, C] = ws.views();
            const c0 = C.slice();
            const want = new Float64Array(M * ldc);
            for (let m = 0; m < M; m++) {
              for (let n = 0; n < N; n++) {
                let s = 0;
                for (let kk = 0; kk < K; kk++) s += A[1 + m * sam + kk * sak] * B[2 + kk * ldb + n];
                want[m * ldc + n] = s;
              }
            }
            k.gemm(M, N, K, A, 1, sam, sak, B, 2, ldb, C, 3, ldc, false);
            for (let m = 0; m < M; m++) {
              close(C.subarray(3 + m * ldc, 3 + m * ldc + N), want.subarray(m * ldc, m * ldc + N), `C ${M}x${N}x${K}`);
              // Padding between rows is not written.
              for (let n = N; n < ldc && 3 + m * ldc + n < C.length; n++) assert.equal(C[3 + m * ldc + n], c0[3 + m * ldc + n]);
            }
            const before = C.slice();
            k.gemm(M, N, K, A, 1, sam, sak, B, 2, ldb, C, 3, ldc, true);
            for (let m = 0; m < M; m++) {
              for (let n = 0; n < N; n++) {
                const i = 3 + m * ldc + n;
                assert.ok(Math.abs(C[i] - (before[i] + want[m * ldc + n])) <= 1e-5 + 1e-5 * Math.abs(C[i]));
              }
            }
            ws.free();
          }
        }
      }
    }
  });

  test(`${k.name}: bias + activation, and the derivative from the output`, () => {
    for (const [name, act] of Object.entries(ACT)) {
      const f = { identity: (z) => z, relu: (z) => (z > 0 ? z : 0), tanh: Math.tanh, sigmoid: (z) => 1 / (1 + Math.exp(-z)) }[name];
      const d = { identity: () => 1, relu: (a) => (a > 0 ? 1 : 0), tanh: (a) => 1 - a * a, sigmoid: (a) => a * (1 - a) }[name];
      for (const cols of [1, 3, 4, 6, 13]) {
        const rows = 5;
        const ws = filled(k, [rows * cols, rows, rows * cols], 4);
        const [Z, b, D] = ws.views();
        const want = Array.from(Z, (z, i) => Math.fround(f(Math.fround(z + b[Math.floor(i / cols)]))));
        k.biasAct(rows, cols, Z, 0, b, 0, act);
        close(Z, want, `${name} out`, 1e-7, 1e-6);
        const wantD = Array.from(D, (x, i) => x * d(Z[i]));
        k.actGrad(rows * cols, D, 0, Z, 0, act);
        // float32 1 − a² cancels near |a| = 1, as the reference's float32 does:
        // an absolute error of a float32 ulp times |D| (up to ~15 here).
        close(D, wantD, `${name} grad`, 2e-6, 1e-6);
        ws.free();
      }
    }
  });

  test(`${k.name}: row sums, transpose, softmax`, () => {
    for (const cols of [1, 3, 4, 5, 8, 17]) {
      const rows = 6;
      const ws = filled(k, [rows * cols, rows, rows * cols, rows * cols, 2 * cols], 3);
      const [D, out, T, P, S] = ws.views();
      const sums = Array.from({ length: rows }, (_, r) => D.subarray(r * cols, (r + 1) * cols).reduce((a, x) => a + x, 0));
      k.rowSums(rows, cols, D, 0, out, 0, false);
      close(out, sums, "row sums");
      k.rowSums(rows, cols, D, 0, out, 0, true);
      close(out, sums.map((s) => 2 * s), "row sums, accumulated");
      k.transpose(rows, cols, D, 0, T, 0);
      for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) assert.equal(T[c * rows + r], D[r * cols + c]);
      // softmax down each column of D viewed as [rows = K, cols = nb]
      const K = rows, nb = cols;
      k.softmax(K, nb, D, 0, P, 0, 0.5, S, 0);
      for (let r = 0; r < nb; r++) {
        const col = Array.from({ length: K }, (_, j) => D[j * nb + r]);
        const m = Math.max(...col);
        const s = col.reduce((a, z) => a + Math.exp(z - m), 0);
        assert.equal(S[r], m);
        assert.ok(Math.abs(S[nb + r] - s) <= 1e-6 * s);
        close(col.map((_, j) => P[j * nb + r]), col.map((z) => (Math.exp(z - m) / s) * 0.5), "softmax", 1e-8, 1e-6);
      }
      ws.free();
    }
  });

  test(`${k.name}: optimizers, vector body and scalar tail`, () => {
    const n = 23;
    for (const opt of ["sgd", "momentum", "nesterov", "adam"]) {
      const ws = filled(k, [n, n, n, n]);
      const [p, grad, s1, s2] = ws.views();
      for (let i = 0; i < n; i++) s2[i] = Math.abs(s2[i]);
      const P = Array.from(p), G = Array.from(grad), V1 = Array.from(s1), V2 = Array.from(s2);
      const want = [];
      if (opt === "sgd") {
        k.sgd(n, p, grad, 0.1);
        for (let i = 0; i < n; i++) want.push(P[i] - 0.1 * G[i]);
      } else if (opt === "adam") {
        k.adam(n, p, grad, s1, s2, 0.9, 0.999, 1e-8, 0.01 / (1 - 0.9 ** 3), Math.sqrt(1 - 0.999 ** 3));
        for (let i = 0; i < n; i++) {
          const m = 0.9 * V1[i] + 0.1 * G[i], v = 0.999 * V2[i] + 0.001 * G[i] * G[i];
          want.push(P[i] - ((0.01 / (1 - 0.9 ** 3)) * m) / (Math.sqrt(v) / Math.sqrt(1 - 0.999 ** 3) + 1e-8));
        }
      } else {
        const nesterov = opt === "nesterov";
        k.momentum(n, p, grad, s1, 0.1, 0.9, nesterov);
        for (let i = 0; i < n; i++) {
          const v = 0.9 * V1[i] + G[i];
          assert.equal(s1[i], Math.fround(v), "velocity");
          want.push(P[i] - 0.1 * (nesterov ? G[i] + 0.9 * v : v));
        }
      }
      close(p, want, opt, 1e-7, 1e-6);
      ws.free();
    }
  });
}

test("wasm: an array from outside the workspace is refused", () => {
  const ws = wasmKernels.workspace([8, 8]);
  const [a, b] = ws.views();
  assert.throws(() => wasmKernels.gemm(1, 1, 1, new Float32Array(1), 0, 1, 1, a, 0, 1, b, 0, 1, false), /workspace/);
  ws.free();
});
