// WebAssembly SIMD kernels of the browser client's MLP (docs/protocol.md §12).
//
// The JS side (src/kernels.js, loadWasmKernels) allocates every buffer of a
// task inside this module's memory with cg_alloc and passes byte pointers, so
// no call copies data. The layouts are src/nn.js's: every layer's activations
// and deltas are feature-major [width, batch], so all three products of a step are
// one shape, "C[m, n] (+)= sum_k a(m, k) * B[k, n]" with B and C contiguous
// along n and a(m, k) read through two strides (cg_gemm). That lets one
// broadcast-A micro-kernel serve X·Wᵀ, dZ·W and dZᵀ·X.
//
// Built freestanding (no libc): the few math functions needed are below.

#include <stdint.h>
#include <wasm_simd128.h>

#define EXPORT(name) __attribute__((export_name(#name))) name

enum { ACT_IDENTITY = 0, ACT_RELU = 1, ACT_TANH = 2, ACT_SIGMOID = 3 };

// -- memory: a bump allocator ------------------------------------------------------

extern unsigned char __heap_base;
static uintptr_t heap_top;

// 64-byte alignment: a buffer starts on a cache line, and v128 loads of its
// first rows never straddle one.
#define ALIGN 64u

// A block of `bytes` bytes, or 0 when the memory cannot grow that far. Growing
// the memory detaches the JS views of the old buffer: the caller re-acquires.
uintptr_t EXPORT(cg_alloc)(uint32_t bytes) {
  if (heap_top == 0) heap_top = ((uintptr_t)&__heap_base + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1);
  uint64_t start = heap_top;
  uint64_t end = (start + bytes + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
  if (end > 0xFFFFFFFFull) return 0;
  uint64_t pages = (end + 65535) >> 16;
  uint64_t have = __builtin_wasm_memory_size(0);
  if (pages > have && __builtin_wasm_memory_grow(0, (uintptr_t)(pages - have)) == (uintptr_t)-1) return 0;
  heap_top = (uintptr_t)end;
  return (uintptr_t)start;
}

// Frees the block at `ptr` (an address cg_alloc returned) and every later one.
void EXPORT(cg_release)(uintptr_t ptr) { heap_top = ptr; }

// The first n < 4 lanes of v from or to memory, for a row's ragged end.
static inline v128_t load_part(const float *p, int n, float *tmp) {
  for (int i = 0; i < 4; i++) tmp[i] = i < n ? p[i] : 0;
  return wasm_v128_load(tmp);
}

static inline void store_part(float *p, int n, v128_t v) {
  if (n == 4) {
    wasm_v128_store(p, v);
    return;
  }
  float tmp[4];
  wasm_v128_store(tmp, v);
  for (int i = 0; i < n; i++) p[i] = tmp[i];
}

// -- GEMM ------------------------------------------------------------------------

// C[m*ldc + n] = (acc ? C : 0) + sum_k A[m*sam + k*sak] * B[k*ldb + n], for m < M, n < N.
//
// Register block: 4 rows of C by 8 columns (8 f32x4 accumulators, 2 loads of B
// and 4 broadcasts of A per k), then 4-column and single-column edges, and
// single rows for M's remainder. No FMA: wasm SIMD has none that is portable,
// and mul + add rounds the same on every engine.
static inline void block4x8(int K, const float *a, int sam, int sak, const float *b, int ldb,
                            float *c, int ldc, int acc) {
  v128_t c00 = wasm_f32x4_splat(0), c01 = c00, c10 = c00, c11 = c00;
  v128_t c20 = c00, c21 = c00, c30 = c00, c31 = c00;
  const float *a0 = a, *a1 = a + sam, *a2 = a + 2 * sam, *a3 = a + 3 * sam;
  for (int k = 0; k < K; k++) {
    v128_t b0 = wasm_v128_load(b), b1 = wasm_v128_load(b + 4);
    v128_t x0 = wasm_f32x4_splat(*a0), x1 = wasm_f32x4_splat(*a1);
    v128_t x2 = wasm_f32x4_splat(*a2), x3 = wasm_f32x4_splat(*a3);
    c00 = wasm_f32x4_add(c00, wasm_f32x4_mul(x0, b0));
    c01 = wasm_f32x4_add(c01, wasm_f32x4_mul(x0, b1));
    c10 = wasm_f32x4_add(c10, wasm_f32x4_mul(x1, b0));
    c11 = wasm_f32x4_add(c11, wasm_f32x4_mul(x1, b1));
    c20 = wasm_f32x4_add(c20, wasm_f32x4_mul(x2, b0));
    c21 = wasm_f32x4_add(c21, wasm_f32x4_mul(x2, b1));
    c30 = wasm_f32x4_add(c30, wasm_f32x4_mul(x3, b0));
    c31 = wasm_f32x4_add(c31, wasm_f32x4_mul(x3, b1));
    a0 += sak; a1 += sak; a2 += sak; a3 += sak;
    b += ldb;
  }
  float *r0 = c, *r1 = c + ldc, *r2 = c + 2 * ldc, *r3 = c + 3 * ldc;
  if (acc) {
    c00 = wasm_f32x4_add(c00, wasm_v128_load(r0)); c01 = wasm_f32x4_add(c01, wasm_v128_load(r0 + 4));
    c10 = wasm_f32x4_add(c10, wasm_v128_load(r1)); c11 = wasm_f32x4_add(c11, wasm_v128_load(r1 + 4));
    c20 = wasm_f32x4_add(c20, wasm_v128_load(r2)); c21 = wasm_f32x4_add(c21, wasm_v128_load(r2 + 4));
    c30 = wasm_f32x4_add(c30, wasm_v128_load(r3)); c31 = wasm_f32x4_add(c31, wasm_v128_load(r3 + 4));
  }
  wasm_v128_store(r0, c00); wasm_v128_store(r0 + 4, c01);
  wasm_v128_store(r1, c10); wasm_v128_store(r1 + 4, c11);
  wasm_v128_store(r2, c20); wasm_v128_store(r2 + 4, c21);
  wasm_v128_store(r3, c30); wasm_v128_store(r3 + 4, c31);
}

static inline void block4x4(int K, const float *a, int sam, int sak, const float *b, int ldb,
                            float *c, int ldc, int acc) {
  v128_t c0 = wasm_f32x4_splat(0), c1 = c0, c2 = c0, c3 = c0;
  const float *a0 = a, *a1 = a + sam, *a2 = a + 2 * sam, *a3 = a + 3 * sam;
  for (int k = 0; k < K; k++) {
    v128_t b0 = wasm_v128_load(b);
    c0 = wasm_f32x4_add(c0, wasm_f32x4_mul(wasm_f32x4_splat(*a0), b0));
    c1 = wasm_f32x4_add(c1, wasm_f32x4_mul(wasm_f32x4_splat(*a1), b0));
    c2 = wasm_f32x4_add(c2, wasm_f32x4_mul(wasm_f32x4_splat(*a2), b0));
    c3 = wasm_f32x4_add(c3, wasm_f32x4_mul(wasm_f32x4_splat(*a3), b0));
    a0 += sak; a1 += sak; a2 += sak; a3 += sak;
    b += ldb;
  }
  float *r0 = c, *r1 = c + ldc, *r2 = c + 2 * ldc, *r3 = c + 3 * ldc;
  if (acc) {
    c0 = wasm_f32x4_add(c0, wasm_v128_load(r0));
    c1 = wasm_f32x4_add(c1, wasm_v128_load(r1));
    c2 = wasm_f32x4_add(c2, wasm_v128_load(r2));
    c3 = wasm_f32x4_add(c3, wasm_v128_load(r3));
  }
  wasm_v128_store(r0, c0);
  wasm_v128_store(r1, c1);
  wasm_v128_store(r2, c2);
  wasm_v128_store(r3, c3);
}

// One row of C, 4 columns at a time (M's remainder).
static inline void row1x4(int K, const float *a, int sak, const float *b, int ldb, float *c, int acc) {
  v128_t c0 = wasm_f32x4_splat(0);
  for (int k = 0; k < K; k++) {
    c0 = wasm_f32x4_add(c0, wasm_f32x4_mul(wasm_f32x4_splat(*a), wasm_v128_load(b)));
    a += sak;
    b += ldb;
  }
  if (acc) c0 = wasm_f32x4_add(c0, wasm_v128_load(c));
  wasm_v128_store(c, c0);
}

// Scalar dot product for N's last (N mod 4) columns.
static inline void cell(int K, const float *a, int sak, const float *b, int ldb, float *c, int acc) {
  float s = 0;
  for (int k = 0; k < K; k++) {
    s += *a * *b;
    a += sak;
    b += ldb;
  }
  *c = acc ? *c + s : s;
}

void EXPORT(cg_gemm)(int M, int N, int K, const float *A, int sam, int sak, const float *B, int ldb,
                     float *C, int ldc, int acc) {
  // Row blocks outside, so a 4-row panel of A (a layer's W: 16 KB at K = 1024)
  // stays in L1 while it meets every column block of B (the batch).
  int m = 0;
  for (; m + 4 <= M; m += 4) {
    const float *a = A + m * sam;
    float *c = C + m * ldc;
    int n = 0;
    for (; n + 8 <= N; n += 8) block4x8(K, a, sam, sak, B + n, ldb, c + n, ldc, acc);
    for (; n + 4 <= N; n += 4) block4x4(K, a, sam, sak, B + n, ldb, c + n, ldc, acc);
    for (; n < N; n++)
      for (int r = 0; r < 4; r++) cell(K, a + r * sam, sak, B + n, ldb, c + r * ldc + n, acc);
  }
  for (; m < M; m++) {
    const float *a = A + m * sam;
    float *c = C + m * ldc;
    int n = 0;
    for (; n + 4 <= N; n += 4) row1x4(K, a, sak, B + n, ldb, c + n, acc);
    for (; n < N; n++) cell(K, a, sak, B + n, ldb, c + n, acc);
  }
}

// -- activations -------------------------------------------------------------------

// e^x − 1 in float64, to about 1e-15 relative: x = k·ln2 + r with |r| <= ln2/2,
// e^r − 1 by its Taylor series to r^12 (the next term is below 2e-16),
// then 2^k·(e^r − 1) + (2^k − 1). The series starts at r, so there is no
// cancellation for small x: tanh near 0 keeps its relative precision.
// |x| is clamped to 700: beyond it tanh and sigmoid are flat in float32.
static double expm1_d(double x) {
  if (x > 700) x = 700;
  if (x < -700) x = -700;
  double k = __builtin_rint(x * 1.4426950408889634);  // x / ln 2
  double r = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
  double q = 1.0 / 479001600;  // 1/12!
  q = q * r + 1.0 / 39916800;
  q = q * r + 1.0 / 3628800;
  q = q * r + 1.0 / 362880;
  q = q * r + 1.0 / 40320;
  q = q * r + 1.0 / 5040;
  q = q * r + 1.0 / 720;
  q = q * r + 1.0 / 120;
  q = q * r + 1.0 / 24;
  q = q * r + 1.0 / 6;
  q = q * r + 0.5;
  q = q * r + 1.0;
  q = q * r;  // e^r − 1
  if (k == 0) return q;
  union { uint64_t u; double d; } p2 = {.u = (uint64_t)((int64_t)k + 1023) << 52};
  return p2.d * q + (p2.d - 1.0);
}

static float act_scalar(float z, int act) {
  switch (act) {
    case ACT_RELU:
      return z > 0 ? z : 0;
    case ACT_TANH: {
      double a = z < 0 ? -(double)z : (double)z;
      double em = expm1_d(2 * a);
      double t = em / (em + 2);  // tanh(a) = (e^2a − 1) / (e^2a + 1)
      return (float)(z < 0 ? -t : t);
    }
    case ACT_SIGMOID:
      return (float)(1.0 / (2.0 + expm1_d(-(double)z)));  // 1 / (1 + e^−z)
    default:
      return z;
  }
}

// Z[r*cols + c] = act(Z[r*cols + c] + b[r]): a feature-major layer output, one
// bias per row (neuron). The bias add is float32, like the reference's.
void EXPORT(cg_bias_act)(int rows, int cols, float *Z, const float *b, int act) {
  const v128_t zero = wasm_f32x4_splat(0);
  for (int r = 0; r < rows; r++) {
    float *z = Z + r * cols;
    const v128_t bv = wasm_f32x4_splat(b[r]);
    int c = 0;
    if (act == ACT_IDENTITY || act == ACT_RELU) {
      for (; c + 4 <= cols; c += 4) {
        v128_t v = wasm_f32x4_add(wasm_v128_load(z + c), bv);
        if (act == ACT_RELU) v = wasm_v128_and(v, wasm_f32x4_gt(v, zero));
        wasm_v128_store(z + c, v);
      }
    }
    for (; c < cols; c++) z[c] = act_scalar(z[c] + b[r], act);
  }
}

// D[k] *= act'(A[k]) for k < n, the derivative read from the output A:
// relu 1 where A > 0 else 0, tanh 1 − A², sigmoid A(1 − A).
void EXPORT(cg_act_grad)(int n, float *D, const float *A, int act) {
  if (act == ACT_IDENTITY) return;
  const v128_t one = wasm_f32x4_splat(1), zero = wasm_f32x4_splat(0);
  int k = 0;
  for (; k + 4 <= n; k += 4) {
    v128_t a = wasm_v128_load(A + k), d = wasm_v128_load(D + k);
    if (act == ACT_RELU) d = wasm_v128_and(d, wasm_f32x4_gt(a, zero));
    else if (act == ACT_TANH) d = wasm_f32x4_mul(d, wasm_f32x4_sub(one, wasm_f32x4_mul(a, a)));
    else d = wasm_f32x4_mul(d, wasm_f32x4_mul(a, wasm_f32x4_sub(one, a)));
    wasm_v128_store(D + k, d);
  }
  for (; k < n; k++) {
    float a = A[k];
    if (act == ACT_RELU) D[k] = a > 0 ? D[k] : 0;
    else if (act == ACT_TANH) D[k] *= 1 - a * a;
    else D[k] *= a * (1 - a);
  }
}

// out[r] = (acc ? out[r] : 0) + sum_c D[r*cols + c]: the bias gradient of a
// feature-major delta.
void EXPORT(cg_row_sums)(int rows, int cols, const float *D, float *out, int acc) {
  for (int r = 0; r < rows; r++) {
    const float *d = D + r * cols;
    v128_t s4 = wasm_f32x4_splat(0);
    int c = 0;
    for (; c + 4 <= cols; c += 4) s4 = wasm_f32x4_add(s4, wasm_v128_load(d + c));
    float s = (wasm_f32x4_extract_lane(s4, 0) + wasm_f32x4_extract_lane(s4, 1)) +
              (wasm_f32x4_extract_lane(s4, 2) + wasm_f32x4_extract_lane(s4, 3));
    for (; c < cols; c++) s += d[c];
    out[r] = acc ? out[r] + s : s;
  }
}

// dst[c*rows + r] = src[r*cols + c].
void EXPORT(cg_transpose)(int rows, int cols, const float *src, float *dst) {
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

// -- softmax over a feature-major output ------------------------------------------------

// e^x in float32 to about 1 ulp, 4 lanes: x = k·ln2 + r, Cephes' expf polynomial
// for e^r, 2^k put into the exponent bits. Used where the reference itself
// takes a float32 exp (the softmax of the loss). x is clamped to [−87.3, 88.7]:
// below, 2^k would be subnormal; a softmax term that small (the row maximum is
// subtracted first) changes no sum.
static inline v128_t exp4(v128_t x) {
  x = wasm_f32x4_max(x, wasm_f32x4_splat(-87.3f));
  x = wasm_f32x4_min(x, wasm_f32x4_splat(88.7f));
  v128_t k = wasm_f32x4_nearest(wasm_f32x4_mul(x, wasm_f32x4_splat(1.44269504088896341f)));
  v128_t r = wasm_f32x4_sub(x, wasm_f32x4_mul(k, wasm_f32x4_splat(0.693359375f)));
  r = wasm_f32x4_sub(r, wasm_f32x4_mul(k, wasm_f32x4_splat(-2.12194440e-4f)));
  v128_t p = wasm_f32x4_splat(1.9875691500e-4f);
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.3981999507e-3f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(8.3334519073e-3f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(4.1665795894e-2f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.6666665459e-1f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(5.0000001201e-1f));
  p = wasm_f32x4_add(wasm_f32x4_add(wasm_f32x4_mul(wasm_f32x4_mul(p, r), r), r), wasm_f32x4_splat(1));
  v128_t scale = wasm_i32x4_add(wasm_i32x4_shl(wasm_i32x4_trunc_sat_f32x4(k), 23), wasm_i32x4_splat(0x3f800000));
  return wasm_f32x4_mul(p, scale);
}

// For each column r of the [K, nb] output Z: m = max_j Z[j, r], s = sum_j e^(Z − m),
// D[j, r] = e^(Z[j, r] − m) / s · scale (the softmax, scaled); S[r] = m and
// S[nb + r] = s, from which the caller takes logsumexp = ln s + m. Columns are
// independent, so 4 go at once; a remainder is padded through a small buffer.
void EXPORT(cg_softmax)(int K, int nb, const float *Z, float *D, float scale, float *S) {
  for (int r = 0; r < nb; r += 4) {
    int lanes = nb - r < 4 ? nb - r : 4;
    float tmp[4];
#define LOAD(j) (lanes == 4 ? wasm_v128_load(Z + (j) * nb + r) : load_part(Z + (j) * nb + r, lanes, tmp))
    v128_t m = LOAD(0);
    for (int j = 1; j < K; j++) m = wasm_f32x4_max(m, LOAD(j));
    v128_t s = wasm_f32x4_splat(0);
    for (int j = 0; j < K; j++) {
      v128_t e = exp4(wasm_f32x4_sub(LOAD(j), m));
      s = wasm_f32x4_add(s, e);
      store_part(D + j * nb + r, lanes, e);
    }
    v128_t inv = wasm_f32x4_div(wasm_f32x4_splat(scale), s);
    for (int j = 0; j < K; j++) {
      float *d = D + j * nb + r;
      store_part(d, lanes, wasm_f32x4_mul(lanes == 4 ? wasm_v128_load(d) : load_part(d, lanes, tmp), inv));
    }
    store_part(S + r, lanes, m);
    store_part(S + nb + r, lanes, s);
#undef LOAD
  }
}

// -- optimizers (§12.5): each formula in float64, rounded to float32 on store,
// exactly as the reference (nn/kernels.py optimizer_update_) orders it ------------

// Four float32 values as two f64x2 halves, and back (each lane rounded once).
#define LO(v) wasm_f64x2_promote_low_f32x4(v)
#define HI(v) wasm_f64x2_promote_low_f32x4(wasm_i32x4_shuffle(v, v, 2, 3, 0, 1))
static inline v128_t to_f32(v128_t lo, v128_t hi) {
  return wasm_i32x4_shuffle(wasm_f32x4_demote_f64x2_zero(lo), wasm_f32x4_demote_f64x2_zero(hi), 0, 1, 4, 5);
}

// Plain SGD in float32, p + (−lr)·g: the reference folds this step into its
// weight-gradient sgemm (alpha = −lr, beta = 1), float32 arithmetic too. Four
// lanes instead of two float64 ones halve the one pass over every parameter
// that each step makes (a tenth of a medium model's step).
void EXPORT(cg_sgd)(int n, float *p, const float *g, double lr) {
  const float nlr = (float)-lr;
  const v128_t vlr = wasm_f32x4_splat(nlr);
  int k = 0;
  for (; k + 4 <= n; k += 4) {
    v128_t pv = wasm_v128_load(p + k), gv = wasm_v128_load(g + k);
    wasm_v128_store(p + k, wasm_f32x4_add(pv, wasm_f32x4_mul(vlr, gv)));
  }
  for (; k < n; k++) p[k] = p[k] + nlr * g[k];
}

// The updated v of the reference is its float64 value, rounded only on store.
static inline v128_t momentum2(v128_t pd, v128_t gd, v128_t *vd, v128_t lr, v128_t mu, int nesterov) {
  v128_t v = wasm_f64x2_add(wasm_f64x2_mul(mu, *vd), gd);
  *vd = v;
  v128_t step = nesterov ? wasm_f64x2_add(gd, wasm_f64x2_mul(mu, v)) : v;
  return wasm_f64x2_sub(pd, wasm_f64x2_mul(lr, step));
}

void EXPORT(cg_momentum)(int n, float *p, const float *g, float *vel, double lr, double mu,
                         int nesterov) {
  const v128_t vlr = wasm_f64x2_splat(lr), vmu = wasm_f64x2_splat(mu);
  int k = 0;
  for (; k + 4 <= n; k += 4) {
    v128_t pv = wasm_v128_load(p + k), gv = wasm_v128_load(g + k), vv = wasm_v128_load(vel + k);
    v128_t vlo = LO(vv), vhi = HI(vv);
    v128_t lo = momentum2(LO(pv), LO(gv), &vlo, vlr, vmu, nesterov);
    v128_t hi = momentum2(HI(pv), HI(gv), &vhi, vlr, vmu, nesterov);
    wasm_v128_store(vel + k, to_f32(vlo, vhi));
    wasm_v128_store(p + k, to_f32(lo, hi));
  }
  for (; k < n; k++) {
    double gk = g[k];
    double v = mu * (double)vel[k] + gk;
    vel[k] = (float)v;
    p[k] = (float)((double)p[k] - lr * (nesterov ? gk + mu * v : v));
  }
}

// `step` = lr / (1 − β₁ᵗ) and `bc2` = sqrt(1 − β₂ᵗ), computed once per step by the caller.
// Its float64 divisions and square root make Adam's pass ~3 ns a parameter,
// nearly as long as a medium model's whole SGD step; float32 lanes would halve
// that, but §12.5 states the formulas in float64.
static inline v128_t adam2(v128_t pd, v128_t gd, v128_t *md, v128_t *vd, v128_t b1, v128_t c1,
                           v128_t b2, v128_t c2, v128_t eps, v128_t step, v128_t bc2) {
  v128_t m = wasm_f64x2_add(wasm_f64x2_mul(b1, *md), wasm_f64x2_mul(c1, gd));
  v128_t v = wasm_f64x2_add(wasm_f64x2_mul(b2, *vd), wasm_f64x2_mul(wasm_f64x2_mul(c2, gd), gd));
  *md = m;
  *vd = v;
  v128_t den = wasm_f64x2_add(wasm_f64x2_div(wasm_f64x2_sqrt(v), bc2), eps);
  return wasm_f64x2_sub(pd, wasm_f64x2_div(wasm_f64x2_mul(step, m), den));
}

void EXPORT(cg_adam)(int n, float *p, const float *g, float *m1, float *m2, double b1, double b2,
                     double eps, double step, double bc2) {
  const v128_t vb1 = wasm_f64x2_splat(b1), vc1 = wasm_f64x2_splat(1 - b1);
  const v128_t vb2 = wasm_f64x2_splat(b2), vc2 = wasm_f64x2_splat(1 - b2);
  const v128_t veps = wasm_f64x2_splat(eps), vstep = wasm_f64x2_splat(step), vbc2 = wasm_f64x2_splat(bc2);
  int k = 0;
  for (; k + 4 <= n; k += 4) {
    v128_t pv = wasm_v128_load(p + k), gv = wasm_v128_load(g + k);
    v128_t mv = wasm_v128_load(m1 + k), vv = wasm_v128_load(m2 + k);
    v128_t mlo = LO(mv), mhi = HI(mv), vlo = LO(vv), vhi = HI(vv);
    v128_t lo = adam2(LO(pv), LO(gv), &mlo, &vlo, vb1, vc1, vb2, vc2, veps, vstep, vbc2);
    v128_t hi = adam2(HI(pv), HI(gv), &mhi, &vhi, vb1, vc1, vb2, vc2, veps, vstep, vbc2);
    wasm_v128_store(m1 + k, to_f32(mlo, mhi));
    wasm_v128_store(m2 + k, to_f32(vlo, vhi));
    wasm_v128_store(p + k, to_f32(lo, hi));
  }
  for (; k < n; k++) {
    double gk = g[k];
    double m = b1 * (double)m1[k] + (1 - b1) * gk;
    double v = b2 * (double)m2[k] + (1 - b2) * gk * gk;
    m1[k] = (float)m;
    m2[k] = (float)v;
    p[k] = (float)((double)p[k] - step * m / (__builtin_sqrt(v) / bc2 + eps));
  }
}
