"""The soak's report: figures from what ``testkit/soak.py`` recorded, and its verdict.

``summarize`` turns a finished ``Soak`` into a ``SoakReport``: acknowledgements
seen and lost, each coordinator kill's recovery (respawn to the first
``accepted`` ack the proxy read from the new process, and kill to it), each
client's rejoin after a disruption (its next ``welcome``), the coordinator's RSS
per process (first, peak, last, slope after a minute's warm-up), accuracy and
loss from ``/api/history`` over the run, and the faults the proxy injected.
``ok`` holds when nothing acknowledged was lost, no checkpoint was corrupt,
every kill was followed by an accepted result, every client came back, versions
never went back and the model improved (its last evaluation more accurate and of
lower loss than its first). ``table()`` is the human form.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from testkit.soakcheck import slope_mb_per_min

#: RSS samples this soon after a process's start are its warm-up, not its trend.
WARMUP_S = 60.0


@dataclass(slots=True)
class SoakReport:
    data: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.data["problems"]

    def to_json(self) -> dict[str, Any]:
        return self.data

    def table(self) -> str:
        d = self.data
        a, r, m, f = d["acks"], d["recovery"], d["model"], d["faults"]
        rows = [
            ("duration", f"{d['duration_s']:.0f} s, {d['clients']} clients, seed {d['seed']}"),
            ("acks seen (accepted / duplicate)", f"{a['accepted']} / {a['duplicate']}"),
            ("acknowledged results lost", f"{a['lost']} of {a['checked']} checked"),
            ("coordinator kill -9", f"{r['kills']} ({r['recovered']} recovered)"),
            ("respawn -> first accepted, s", _spread(r["respawn_to_accept_s"])),
            ("kill -> first accepted, s", _spread(r["kill_to_accept_s"])),
            ("client kill -9", str(d["clients_killed"])),
            ("client rejoin, s", _spread(d["rejoin"]["seconds"])),
            ("clients that did not come back", ", ".join(d["not_back"]) or "none"),
            ("coordinator RSS, MB", _rss_line(d["rss"])),
            ("accuracy first -> last", _acc_line(m)),
            ("faults", ", ".join(f"{k} {v}" for k, v in f["counts"].items())),
            ("model at the end", f"v{d['final_version']} (the last kill's store check)"),
            ("verdict", "ok" if self.ok else "FAILED: " + "; ".join(d["problems"])),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"median {statistics.median(xs):.2f}, max {max(xs):.2f} (n={len(xs)})"


def _rss_line(rss: dict[str, Any]) -> str:
    runs = rss["runs"]
    if not runs:
        return "-"
    peaks = " ".join(f"{p['peak_mb']:.0f}" for p in runs)
    slopes = [p["slope_mb_per_min"] for p in runs if p["slope_mb_per_min"] is not None]
    worst = f", steepest slope {max(slopes):+.2f} MB/min" if slopes else ""
    return f"peak per process {peaks}{worst}"


def _acc_line(m: dict[str, Any]) -> str:
    if not m["evaluations"]:
        return "no evaluation"
    first, last = m["first"], m["last"]
    return (
        f"{first['accuracy']:.4f} (v{first['version']}) -> {last['accuracy']:.4f} "
        f"(v{last['version']}), loss {first['loss']:.3f} -> {last['loss']:.3f}, "
        f"{m['evaluations']} evaluations"
    )


def summarize(soak: Any, **kw: Any) -> SoakReport:
    cfg = soak.cfg
    slots, settle, status, history = kw["slots"], kw["settle"], kw["status"], kw["history"]
    events, proxy_bytes, partitions = kw["faults"]
    problems: list[str] = list(kw["problems"])
    wire = soak.ledger.snapshot()
    acks = [e for e in wire if e.kind == "ack"]
    lost = sorted({t for c in soak.checks for t in c.lost})
    corrupt = [x for c in soak.checks for x in c.corrupt]
    if lost:
        problems.append(f"{len(lost)} acknowledged results lost: {lost[:20]}")
    if corrupt:
        problems.append(f"corrupt checkpoints after a kill: {corrupt[:5]}")
    versions = [c.version for c in soak.checks]
    if any(b < a for a, b in itertools.pairwise(versions)):
        problems.append(f"a restart would have gone back in versions: {versions}")
    recovery = _recovery(soak, acks)
    unrecovered = recovery["kills"] - recovery["recovered"]
    if unrecovered:
        problems.append(f"{unrecovered} coordinator kills not followed by an accepted result")
    rejoin = _rejoins(soak, wire)
    not_back = sorted(set(settle.get("not_back", [])) | {s.name for s in slots if s.exited})
    if not_back:
        why = {s.name: s.exited for s in slots if s.exited}
        problems.append(f"clients that did not come back: {not_back} {why}")
    model = _model(history, soak.wall0, [k["at_s"] for k in soak.kills if not k["final"]])
    if not model["improving"]:
        problems.append(f"the model did not improve: {model.get('first')} -> {model.get('last')}")
    checked = sum(c.checked for c in soak.checks)
    if not checked and not problems:
        problems.append("no acknowledgement was checked: the soak proved nothing")
    counts = Counter(e.kind for e in events)
    data = {
        "duration_s": cfg.duration_s,
        "clients": cfg.clients,
        "seed": cfg.seed,
        "acks": {
            "accepted": sum(e.accepted for e in acks),
            "duplicate": sum(e.reason == "duplicate" for e in acks),
            "refused": Counter(e.reason for e in acks if not e.promises),
            "checked": checked,
            "lost": len(lost),
            "lost_ids": lost,
        },
        "kills": soak.kills,
        "recovery": recovery,
        "clients_killed": len(soak.client_kills),
        "client_kills": soak.client_kills,
        "rejoin": rejoin,
        "not_back": not_back,
        "settle": settle,
        "rss": _rss(soak),
        "model": model,
        "faults": {
            "counts": {k: counts.get(k, 0) for k in ("connect", "refused", "drop", "reset")}
            | {k: counts.get(k, 0) for k in ("blackhole", "partition")},
            "partitions": partitions,
            "bytes": proxy_bytes,
            "plan": _plan(cfg.faults),
        },
        "final_version": versions[-1] if versions else None,
        "last_status": {k: status.get(k) for k in ("version", "clients", "accepted_results")},
        "problems": problems,
    }
    return SoakReport(data)


def _recovery(soak: Any, acks: list[Any]) -> dict[str, Any]:
    rows, runs = [], soak.runs
    for kill in (k for k in soak.kills if not k["final"]):
        nxt = runs[kill["run"] + 1] if kill["run"] + 1 < len(runs) else None
        if nxt is None:
            continue
        until = nxt.get("killed", float("inf"))
        first = next(
            (e.t - soak.t0 for e in acks if e.accepted and nxt["spawned"] <= e.t - soak.t0 < until),
            None,
        )
        rows.append({
            "killed_at_s": kill["at_s"],
            "respawn_s": round(nxt["spawned"] - kill["at_s"], 3),  # the check's time
            "ready_s": round(nxt.get("ready", float("nan")) - nxt["spawned"], 3),
            "respawn_to_accept_s": None if first is None else round(first - nxt["spawned"], 3),
            "kill_to_accept_s": None if first is None else round(first - kill["at_s"], 3),
        })  # fmt: skip
    done = [r for r in rows if r["respawn_to_accept_s"] is not None]
    return {
        "kills": len(rows),
        "recovered": len(done),
        "respawn_to_accept_s": [r["respawn_to_accept_s"] for r in done],
        "kill_to_accept_s": [r["kill_to_accept_s"] for r in done],
        "rows": rows,
    }


def _rejoins(soak: Any, wire: list[Any]) -> dict[str, Any]:
    welcomes: dict[str, list[float]] = {}
    for e in wire:
        if e.kind == "welcome":
            welcomes.setdefault(e.client, []).append(e.t - soak.t0)
    rows = []
    for name, at, cause in soak.disruptions:
        t = next((w for w in welcomes.get(name, []) if w >= at), None)
        rows.append({"client": name, "at_s": round(at, 2), "cause": cause,
                     "rejoin_s": None if t is None else round(t - at, 3)})  # fmt: skip
    secs = [r["rejoin_s"] for r in rows if r["rejoin_s"] is not None]
    late = [r for r in rows if r["rejoin_s"] is None or r["rejoin_s"] > soak.cfg.rejoin_deadline_s]
    return {"seconds": secs, "late_or_never": late, "rows": rows}


def _rss(soak: Any) -> dict[str, Any]:
    runs = []
    for run in soak.runs:
        samples = [(t, mb) for t, n, mb in soak.rss if n == run["run"]]
        if not samples:
            continue
        warm = [(t, mb) for t, mb in samples if t - run["spawned"] >= WARMUP_S]
        runs.append({
            "run": run["run"],
            "samples": len(samples),
            "first_mb": samples[0][1],
            "peak_mb": max(mb for _, mb in samples),
            "last_mb": samples[-1][1],
            "slope_mb_per_min": _round(slope_mb_per_min(warm)),
        })  # fmt: skip
    return {"every_s": soak.cfg.rss_every_s, "runs": runs, "series": soak.rss}


def _model(history: dict[str, Any], wall0: float, kills: list[float]) -> dict[str, Any]:
    rows = (history.get("evaluations") or {}).get("rows") or []
    evals = [
        {"t_s": round(t - wall0, 1), "version": int(v), "accuracy": round(a, 4)}
        | {"loss": round(x, 4)}
        for t, v, a, x in rows
    ]
    out: dict[str, Any] = {"evaluations": len(evals), "series": evals, "improving": False}
    if len(evals) < 2:
        return out
    first, last = evals[0], evals[-1]
    before = [e for e in evals if kills and e["t_s"] < kills[0]]
    out |= {
        "first": first,
        "best": max(evals, key=lambda e: e["accuracy"]),
        "last": last,
        "before_first_kill": before[-1] if before else None,
        "improving": last["accuracy"] > first["accuracy"] and last["loss"] < first["loss"],
    }
    return out


def _plan(plan: Any) -> dict[str, Any]:
    return {k: getattr(plan, k) for k in plan.__dataclass_fields__}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
