// Wire error codes and close codes (docs/protocol.md §7).
//
// A ProtocolError is always the PEER's fault: a frame, field or chunk that does
// not conform. The session turns it into an `error` message and a close with
// clientCloseCode(code). Our own bugs are ordinary Errors and never go on the
// wire as anything but INTERNAL.

/** Error codes by name. Part of the wire format: never renumbered, only added. */
export const ErrorCode = Object.freeze({
  MALFORMED: 1,
  UNKNOWN_TYPE: 2,
  BAD_FIELD: 3,
  UNSUPPORTED_VERSION: 4,
  TOO_LARGE: 5,
  RATE_LIMITED: 6,
  AUTH_FAILED: 7,
  UNKNOWN_TASK: 8,
  BAD_CHUNK: 9,
  CHECKSUM: 10,
  DUPLICATE: 11,
  CONFLICT: 12,
  UNEXPECTED: 13,
  TIMEOUT: 14,
  SHUTTING_DOWN: 15,
  INTERNAL: 16,
  SLOW_CONSUMER: 17,
  REPLACED: 18,
});

/** The same table under the name session.js imports. */
export const ERROR_CODES = ErrorCode;

/** @type {Map<number, string>} */
const NAMES = new Map(Object.entries(ErrorCode).map(([name, code]) => [code, name]));

/** The name of a code, or null for a code this version does not know (a newer
 *  peer's: it is kept as a number, §9). */
/** @param {number} code */
export function errorName(code) {
  return NAMES.get(code) ?? null;
}

/** Close code after a clean `bye` (and when the job is finished). */
export const CLOSE_NORMAL = 1000;

/** Close code a client uses when it closes for error `code`: 4000 + code, because
 *  a browser's WebSocket.close() accepts only 1000 and 3000–4999 (§7), so the
 *  server's 1xxx codes (1007, 1009, ...) are not available to it. */
/** @param {number} code */
export function clientCloseCode(code) {
  return 4000 + code;
}

export class ProtocolError extends Error {
  /** @param {number} code one of ErrorCode; @param {string} message names the field */
  constructor(code, message) {
    super(message);
    this.name = "ProtocolError";
    this.code = code;
  }

  /** e.g. "BAD_FIELD" (or the number, for an unknown code). */
  get codeName() {
    return errorName(this.code) ?? String(this.code);
  }

  get closeCode() {
    return clientCloseCode(this.code);
  }
}
