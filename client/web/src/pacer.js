// Sender pacing to the granted limits (docs/protocol.md §8): two token buckets,
// bytes and messages; a frame larger than the byte bucket goes from a full
// bucket and leaves a debt. The same rule as protocol/limits.py's Pacer, so a
// browser never trips the server's RATE_LIMITED meter.

const MIN_FRAME_BYTES = 4096;

/** A link's limits as welcome.limits carries them (§3.2): a null rate is no limit.
 *  @typedef {{bytes_per_s?: number | null, messages_per_s?: number | null, burst?: number, max_message_bytes: number}} WireLimits */

/** Limits as the wire has them (nil rate = no limit), with derived sizes.
 *  @param {WireLimits} wire */
export function linkLimits(wire) {
  const bytesPerS = wire.bytes_per_s ?? Infinity;
  const messagesPerS = wire.messages_per_s ?? Infinity;
  const burst = wire.burst ?? 1.0;
  const maxMessageBytes = wire.max_message_bytes;
  const burstBytes = bytesPerS * burst;
  const frameBytes =
    bytesPerS === Infinity
      ? maxMessageBytes
      : Math.min(maxMessageBytes, Math.max(MIN_FRAME_BYTES, Math.floor(burstBytes)));
  return {
    bytesPerS,
    messagesPerS,
    burst,
    maxMessageBytes,
    burstBytes,
    burstMessages: Math.max(1, messagesPerS * burst),
    frameBytes,
  };
}

/** @typedef {ReturnType<typeof linkLimits>} LinkLimits */

/** What a volunteer asks for in hello.limits to move at most `mbPerHour`
 *  megabytes (10⁶ bytes) an hour, both directions together: half of it each way,
 *  the server's own message rate and frame size (it grants the tighter of both).
 *  The same map as protocol/limits.py's data_cap.
 *  @param {number} mbPerHour @returns {WireLimits} */
export function dataCap(mbPerHour) {
  if (typeof mbPerHour !== "number" || !(mbPerHour > 0) || !Number.isFinite(mbPerHour)) {
    throw new RangeError(`data cap: must be finite megabytes an hour > 0, got ${mbPerHour}`);
  }
  return {
    bytes_per_s: (mbPerHour * 1e6) / 3600 / 2,
    messages_per_s: null,
    max_message_bytes: 256 * 1024 * 1024,
    burst: 1.0,
  };
}

class Bucket {
  /** @param {number} rate @param {number} capacity */
  constructor(rate, capacity) {
    this.rate = rate;
    this.capacity = capacity;
    this.level = capacity;
    this.t = -Infinity;
  }

  /** @param {number} now */
  refill(now) {
    if (this.rate === Infinity) this.level = this.capacity;
    else if (this.t !== -Infinity && now > this.t)
      this.level = Math.min(this.capacity, this.level + (now - this.t) * this.rate);
    if (now > this.t) this.t = now;
  }
}

export class Pacer {
  /** @param {LinkLimits} limits */
  constructor(limits) {
    this.limits = limits;
    this.bytes = new Bucket(limits.bytesPerS, limits.bytesPerS < Infinity ? limits.burstBytes : Infinity);
    this.msgs = new Bucket(limits.messagesPerS, limits.burstMessages);
  }

  /** Earliest time ≥ now at which a frame of n bytes may go. */
  /** @param {number} n @param {number} now */
  nextSendTime(n, now) {
    const { bytes, msgs } = this;
    bytes.refill(now);
    msgs.refill(now);
    const need = n < bytes.capacity ? n : bytes.capacity;
    let t = now;
    if (need > bytes.level) t = now + (need - bytes.level) / bytes.rate;
    if (msgs.level < 1) t = Math.max(t, now + (1 - msgs.level) / msgs.rate);
    return t;
  }

  /** Take the tokens of a frame of n bytes if it is due now; say whether it was. */
  /** @param {number} n @param {number} now */
  tryConsume(n, now) {
    if (this.nextSendTime(n, now) > now) return false;
    if (this.bytes.rate < Infinity) this.bytes.level -= n;
    if (this.msgs.rate < Infinity) this.msgs.level -= 1;
    return true;
  }
}
