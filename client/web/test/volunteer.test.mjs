// The browser volunteer's key and name (src/volunteer.js) against the rules of
// protocol/volunteer.py, which the coordinator applies to every hello.
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  KEY_ITEM, NAME_ITEM, NAME_MAX, checkKey, checkName, defaultName, formatFlops, loadIdentity, newKey, saveName,
} from "../src/volunteer.js";

/** localStorage as a Map; `refuse`: every call throws (a sandboxed frame). */
function fakeStorage({ refuse = false, readOnly = false } = {}) {
  const items = new Map();
  return {
    items,
    getItem(k) {
      if (refuse) throw new Error("SecurityError");
      return items.has(k) ? items.get(k) : null;
    },
    setItem(k, v) {
      if (refuse || readOnly) throw new Error("QuotaExceededError");
      items.set(k, String(v));
    },
  };
}

test("a new key: 43 URL-safe characters of 32 random bytes, a valid key", () => {
  const key = newKey();
  assert.equal(key.length, 43);
  assert.match(key, /^[A-Za-z0-9_-]{43}$/);
  assert.equal(checkKey(key), null);
  assert.notEqual(newKey(), key);
  // base64url of the bytes, as Python's secrets.token_urlsafe(32)
  const bytes = Uint8Array.from({ length: 32 }, (_, i) => 250 + i);
  assert.equal(newKey((b) => (b.set(bytes.subarray(0, b.length)), b)),
    Buffer.from(bytes).toString("base64url"));
});

test("checkKey: protocol/volunteer.py's rule", () => {
  assert.equal(checkKey("a".repeat(16)), null);
  assert.equal(checkKey("a".repeat(128)), null);
  assert.equal(checkKey("Az09-_".repeat(3)), null);
  assert.match(checkKey("a".repeat(15)), /16\.\.128 characters, got 15/);
  assert.match(checkKey("a".repeat(129)), /got 129/);
  for (const bad of ["a".repeat(15) + "=", "a".repeat(15) + "+", "a".repeat(15) + " ", "a".repeat(15) + "é"])
    assert.match(checkKey(bad), /letters, digits/);
});

test("checkName: printable, 1..32 code points, a plain space the only separator", () => {
  for (const ok of ["a", "Ada Lovelace", "tab-1a2b", "x".repeat(NAME_MAX), "🙂".repeat(32), "Zoë", "李小龍", "crowdgrad-web/0.1"])
    assert.equal(checkName(ok), null, ok);
  assert.equal(checkName(""), "a non-blank name");
  assert.equal(checkName("   "), "a non-blank name");
  assert.equal(checkName("x".repeat(33)), "at most 32 characters, got 33");
  assert.equal(checkName("🙂".repeat(33)), "at most 32 characters, got 33"); // code points, not UTF-16 units
  const cases = { "a\tb": "0009", "a\u202eb": "202E", "a\u200bb": "200B", "a\u00a0b": "00A0", "a\nb": "000A",
    "a\u2028b": "2028", "a\u0378b": "0378" /* unassigned */, "a\ue000b": "E000" /* private use */ };
  for (const [name, hex] of Object.entries(cases))
    assert.equal(checkName(name), `printable characters only (not U+${hex})`, JSON.stringify(name));
});

test("the default name: tab- and 4 hex digits, a valid name, not from the key", () => {
  const name = defaultName();
  assert.match(name, /^tab-[0-9a-f]{4}$/);
  assert.equal(checkName(name), null);
  assert.equal(defaultName((b) => b.fill(0xab)), "tab-abab");
});

test("loadIdentity: made once, then the same key and name from the storage", () => {
  const store = fakeStorage();
  const first = loadIdentity(store);
  assert.equal(checkKey(first.key), null);
  assert.match(first.name, /^tab-/);
  assert.equal(first.kept, true);
  assert.equal(store.items.get(KEY_ITEM), first.key);
  assert.equal(store.items.get(NAME_ITEM), first.name);
  const again = loadIdentity(store);
  assert.deepEqual(again, first);
  assert.equal(saveName(store, "Ada"), null);
  assert.equal(loadIdentity(store).name, "Ada");
  assert.equal(loadIdentity(store).key, first.key);
});

test("loadIdentity: a malformed key or name kept is replaced; a bad name is not saved", () => {
  const store = fakeStorage();
  store.items.set(KEY_ITEM, "short");
  store.items.set(NAME_ITEM, "bad\u202ename");
  const id = loadIdentity(store);
  assert.equal(checkKey(id.key), null);
  assert.equal(store.items.get(KEY_ITEM), id.key);
  assert.match(id.name, /^tab-/);
  assert.equal(saveName(store, " "), "a non-blank name");
  assert.equal(store.items.get(NAME_ITEM), id.name);
});

test("loadIdentity: storage refused or read-only: a key for this page only, said so", () => {
  for (const store of [fakeStorage({ refuse: true }), fakeStorage({ readOnly: true }), null]) {
    const id = loadIdentity(store);
    assert.equal(checkKey(id.key), null);
    assert.equal(checkName(id.name), null);
    assert.equal(id.kept, false);
  }
});

test("formatFlops: human units, three significant digits", () => {
  const cases = [[0, "0 FLOP"], [-1, "0 FLOP"], [NaN, "0 FLOP"], [950, "950 FLOP"], [1234, "1.23 kFLOP"],
    [12_345_678, "12.3 MFLOP"], [4.56e9, "4.56 GFLOP"], [123.4e9, "123 GFLOP"], [999.96e9, "1.00 TFLOP"],
    [1.2e12, "1.20 TFLOP"], [3e21, "3000 EFLOP"]];
  for (const [n, want] of cases) assert.equal(formatFlops(n), want, String(n));
});
