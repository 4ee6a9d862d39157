// The messages between the volunteer page (page.js) and its worker (worker.js),
// as types only: each side imports them in JSDoc, so neither loads the other.

/** The page to the worker. `volunteer` and `name`: the volunteer's key and display
 *  name (volunteer.js), for every hello; "name" changes it for the next hello.
 *  `cap`: the volunteer's data cap in megabytes an hour, both ways (null: none).
 *  @typedef {{cmd: "join", url: string, token: string, share: number, kernels: string, flops?: number,
 *      volunteer: string, name: string, cap?: number | null}
 *    | {cmd: "name", value: string}
 *    | {cmd: "share", value: number}
 *    | {cmd: "hidden", value: boolean}
 *    | {cmd: "pause", value: boolean}
 *    | {cmd: "leave"}
 *    | {cmd: "predict", id: number, x: Float32Array}} ToWorker */

/** The worker's numbers, every half second and on each change; `volunteer`: the
 *  public id of the key, as welcome.volunteer said it (null before);
 *  `linkBytesPerS`: the byte rate each way welcome granted (null: none yet, or no limit).
 *  @typedef {{type: "stats", status: string, phase: string, kernels: string, share: number, hidden: boolean,
 *    paused: boolean, tasks: number, accepted: number, refused: number, declined: number,
 *    refusals: Record<string, number>, unacked: number, computing: boolean, bytesIn: number, bytesOut: number,
 *    modelVersion: number | null, steps: number, busySeconds: number, connects: number, drops: number,
 *    rtt: number | null, finished: string | null, widths: number[] | null, volunteer: string | null,
 *    linkBytesPerS: number | null}} Stats */

/** The worker to the page.
 *  @typedef {Stats
 *    | {type: "log", level: "info" | "warn" | "error", text: string}
 *    | {type: "prediction", id: number, outputs: number[] | null, version: number | null}
 *    | {type: "finished", reason: string, jobDone: boolean}} ToPage */

export {};
