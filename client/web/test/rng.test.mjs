// The generator against tests/vectors/compute/rng.json (docs/protocol.md §12.1).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Generator, seedState } from "../src/rng.js";
import { crc32 } from "../src/crc32.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../../tests/vectors/compute/rng.json", import.meta.url), "utf8"),
);


// JSON.parse reads 2^64 − 1 as a rounded float: the seeds are re-read exactly.
const exactSeeds = [...readFileSync(new URL("../../../tests/vectors/compute/rng.json", import.meta.url), "utf8")
  .matchAll(/"seed": (\d+)/g)].map((m) => BigInt(m[1]));

for (const [i, c] of vectors.cases.entries()) {
  const seed = exactSeeds[i];
  const name = `seed ${seed} stream ${c.stream}`;
  // Small seeds go in as Numbers, large ones as BigInt: both paths are used by callers.
  const arg = seed <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(seed) : seed;

  test(`${name}: state words`, () => {
    assert.deepEqual(seedState(arg, c.stream), c.state);
    assert.deepEqual(new Generator(arg, c.stream).state, c.state);
  });

  test(`${name}: first words and Irwin–Hall values`, () => {
    const g = new Generator(arg, c.stream);
    assert.deepEqual(Array.from({ length: 12 }, () => g.nextU32()), c.next_u32);
    const h = new Generator(arg, c.stream);
    assert.equal(h.normal(), c.irwin_hall_z[0]);
    assert.equal(h.normal(), c.irwin_hall_z[1]);
  });

  test(`${name}: below and permutation(10)`, () => {
    const g = new Generator(arg, c.stream);
    for (const { n, value } of c.below) assert.equal(g.below(n), value, `below(${n})`);
    assert.deepEqual(Array.from(new Generator(arg, c.stream).permutation(10)), c.permutation_10);
  });
}

test("permutation(1000) CRC-32", () => {
  const p = vectors.permutation_1000;
  const perm = new Generator(p.seed, p.stream).permutation(1000);
  assert.equal(crc32(new Uint8Array(perm.buffer)), p.crc32_le_u32);
});

test("a Number seed and the same BigInt seed agree", () => {
  const a = new Generator(2 ** 40 + 12345, 9);
  const b = new Generator(2n ** 40n + 12345n, 9n);
  assert.deepEqual(a.state, b.state);
});

test("normalInto matches normal() times the scale, rounded to float32", () => {
  const a = new Generator(5, 2);
  const b = new Generator(5, 2);
  const out = new Float32Array(20);
  a.normalInto(out, 0.37);
  for (let k = 0; k < 20; k++) assert.equal(out[k], Math.fround(b.normal() * 0.37));
  assert.deepEqual(a.state, b.state);
});

test("bad seeds and bounds are refused", () => {
  assert.throws(() => new Generator(2 ** 60, 0), RangeError);
  assert.throws(() => new Generator(-1, 0), RangeError);
  assert.throws(() => new Generator(1n << 64n, 0), RangeError);
  assert.throws(() => new Generator(0, 2 ** 32), RangeError);
  assert.throws(() => new Generator(0, 0).below(0), RangeError);
  assert.equal(new Generator(0, 0).permutation(0).length, 0);
});

test("below(n) equals the rejection rule computed with BigInt, for n across [1, 2^32]", () => {
  const pick = new Generator(11, 4);
  const fast = new Generator(12, 5);
  const slow = new Generator(12, 5);
  for (let i = 0; i < 200000; i++) {
    const kind = i % 4;
    const n =
      kind === 0 ? 1 + pick.nextU32() // anywhere in [1, 2^32]
        : kind === 1 ? 1 + (pick.nextU32() % 5000) // small
          : kind === 2 ? 2 ** 32 - (pick.nextU32() % 5000) // near 2^32: heavy rejection
            : 2 ** 31 + 1 - (pick.nextU32() % 3); // around 2^31
    const N = BigInt(n);
    const threshold = ((1n << 32n) - N) % N;
    let w;
    do w = BigInt(slow.nextU32());
    while (w < threshold);
    assert.equal(fast.below(n), Number(w % N), `below(${n})`);
  }
});
