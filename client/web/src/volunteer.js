// The browser volunteer's identity (docs/protocol.md §3.1, docs/operations.md
// "Credit"): a secret key made once and kept in the page's localStorage, sent as
// hello.volunteer in every hello, and a display name of the volunteer's choosing,
// sent as hello.client. The rules are protocol/volunteer.py's, so the server
// never refuses what this page sends. DOM-free (a Storage is passed in), so node
// tests it (test/volunteer.test.mjs).

/** A volunteer key's accepted length, and the characters it may use. */
export const KEY_MIN = 16;
export const KEY_MAX = 128;
const KEY_CHARS = /^[A-Za-z0-9_-]*$/;
/** A display name's most characters (code points, as Python counts them). */
export const NAME_MAX = 32;
/** Where the page keeps them (one origin: every tab of this coordinator shares them). */
export const KEY_ITEM = "crowdgrad-volunteer-key";
export const NAME_ITEM = "crowdgrad-volunteer-name";

/** Fills a byte array with random bytes (crypto.getRandomValues).
 *  @typedef {(bytes: Uint8Array) => Uint8Array} RandomFill */
/** The part of the Web Storage API used here (localStorage; a Map-backed fake in tests).
 *  @typedef {{getItem(key: string): string | null, setItem(key: string, value: string): void}} KeyStore */

/** @type {RandomFill} */
const cryptoFill = (bytes) => crypto.getRandomValues(bytes);

/** Why `key` is no volunteer key, or null (protocol/volunteer.py check_key).
 *  @param {string} key */
export function checkKey(key) {
  if (key.length < KEY_MIN || key.length > KEY_MAX) return `${KEY_MIN}..${KEY_MAX} characters, got ${key.length}`;
  if (!KEY_CHARS.test(key)) return "letters, digits, '-' and '_' only";
  return null;
}

// Unicode's "other" (Cc control, Cf format: bidi overrides, zero-width; Cs, Co,
// Cn) and separator (Zs, Zl, Zp) categories: Python's category(c)[0] in "CZ".
const NOT_SHOWN = /[\p{C}\p{Z}]/u;

/** Why `name` may not be shown on a leaderboard, or null (protocol/volunteer.py
 *  check_name): printable text of at most NAME_MAX characters, no control,
 *  format or separator characters other than a plain space, not blank.
 *  @param {string} name */
export function checkName(name) {
  if (name.trim() === "") return "a non-blank name";
  const chars = [...name]; // code points, as Python's len
  if (chars.length > NAME_MAX) return `at most ${NAME_MAX} characters, got ${chars.length}`;
  for (const c of chars) {
    if (c !== " " && NOT_SHOWN.test(c)) {
      const hex = (c.codePointAt(0) ?? 0).toString(16).toUpperCase().padStart(4, "0");
      return `printable characters only (not U+${hex})`;
    }
  }
  return null;
}

/** @param {Uint8Array} bytes */
function base64url(bytes) {
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

/** A fresh key: 43 URL-safe characters of 256 random bits (as the desktop
 *  client's secrets.token_urlsafe(32)).
 *  @param {RandomFill} [fill] */
export function newKey(fill = cryptoFill) {
  return base64url(fill(new Uint8Array(32)));
}

/** A name until the volunteer picks one: `tab-` and 4 hex digits (random, not
 *  from the key: the key is a secret).
 *  @param {RandomFill} [fill] */
export function defaultName(fill = cryptoFill) {
  return `tab-${[...fill(new Uint8Array(2))].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** @param {KeyStore | null} store @param {string} item */
function read(store, item) {
  try {
    return store?.getItem(item) ?? null;
  } catch {
    return null; // storage refused (a sandboxed frame, a privacy mode)
  }
}

/** @param {KeyStore | null} store @param {string} item @param {string} value */
function write(store, item, value) {
  try {
    if (store === null) return false;
    store.setItem(item, value);
    return true;
  } catch {
    return false; // full, or refused
  }
}

/** The volunteer kept in `store` (made there on first use): its key and name. A
 *  missing or malformed key gets a new one; a missing or bad name the default.
 *  `kept`: false where the store would not keep the key, so credit is for this
 *  page's life only (the page says so).
 *  @param {KeyStore | null} store @param {RandomFill} [fill]
 *  @returns {{key: string, name: string, kept: boolean}} */
export function loadIdentity(store, fill = cryptoFill) {
  let key = read(store, KEY_ITEM);
  let kept = true;
  if (key === null || checkKey(key) !== null) {
    key = newKey(fill);
    kept = write(store, KEY_ITEM, key) && read(store, KEY_ITEM) === key;
  }
  let name = read(store, NAME_ITEM);
  if (name === null || checkName(name) !== null) {
    name = defaultName(fill);
    write(store, NAME_ITEM, name);
  }
  return { key, name, kept };
}

/** Keep `name` as the volunteer's display name; why not, or null (kept).
 *  @param {KeyStore | null} store @param {string} name */
export function saveName(store, name) {
  const why = checkName(name);
  if (why !== null) return why;
  write(store, NAME_ITEM, name);
  return null;
}

/** FLOPs in human units: `0 FLOP`, `950 FLOP`, `12.3 MFLOP`, `4.56 GFLOP`,
 *  `1.20 TFLOP` (three significant digits), up to EFLOP.
 *  @param {number} n */
export function formatFlops(n) {
  if (!Number.isFinite(n) || n <= 0) return "0 FLOP";
  const units = ["FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"];
  let i = Math.min(units.length - 1, Math.max(0, Math.floor(Math.log10(n) / 3)));
  let v = n / 10 ** (3 * i);
  // 999.96 GFLOP rounds to 1000: one unit up instead
  if (Number(v.toPrecision(3)) >= 1000 && i < units.length - 1) {
    i += 1;
    v = n / 10 ** (3 * i);
  }
  if (i === 0) return `${Math.round(v)} FLOP`;
  return `${v >= 1000 ? Math.round(v) : v.toPrecision(3)} ${units[i]}`;
}
