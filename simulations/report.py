"""What a simulated run leaves behind: results.json, a CSV time series, plots, a summary.

``write_report(runs, out_dir)`` takes one :class:`RunResult` per point of a sweep
and writes

* ``results.json``: the scenario, the point and the summary of every run, with
  keys sorted and floats as Python prints them, so the same seed gives the same
  bytes (the determinism test compares the files);
* ``timeseries.csv``: virtual time, version, steps, loss, accuracy, bytes up and
  down, clients online, one row per sample and run;
* ``accuracy.png``, ``bytes.png``, ``clients.png``: accuracy, cumulative bytes and
  clients online against virtual time, one line per run (matplotlib, Agg backend);
* ``summary.md``: a table of the runs with the seed's figures beside ours where
  the run reproduces a seed experiment (brief, "Seed results"), and the compute
  rates assumed.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

#: Seed 004 tables 4.4, 4.6 and 4.8 (brief): seconds for 100 updates, 8 players.
SEED_SECONDS: dict[str, dict[str, float]] = {
    "linear": {
        "tiny": 0.017,
        "small": 0.060,
        "medium": 0.804,
        "large": 84.568,
        "huge": 410.809,
        "extreme": 145676.434,
    },
    "central-sync": {"tiny": 0.995, "small": 0.933, "medium": 1.657, "large": 86.582},
    "central-async": {"tiny": 0.641, "small": 0.684, "medium": 1.046, "large": 58.826},
    "decentral-sync": {"tiny": 0.078, "small": 0.086, "medium": 0.242, "large": 17.325},
    "decentral-async": {"tiny": 0.051, "small": 0.063, "medium": 0.195, "large": 13.901},
}
#: Table 4.8, "DC + AS + LP + neuron groups": the chunked runs of the big presets.
SEED_CHUNKED: dict[str, float] = {"huge": 66.838, "extreme": 26143.993}
#: Table 4.7, decentral async against one-way latency (s): small, medium, large.
SEED_LATENCY: dict[float, dict[str, float]] = {
    0.0: {"small": 0.063, "medium": 0.195, "large": 13.90},
    0.01: {"small": 0.077, "medium": 0.206, "large": 14.88},
    0.05: {"small": 0.184, "medium": 0.306, "large": 15.14},
    0.1: {"small": 0.266, "medium": 0.411, "large": 15.15},
    0.3: {"small": 0.668, "medium": 0.798, "large": 15.79},
    1.0: {"small": 2.079, "medium": 2.231, "large": 18.45},
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One row of the time series; accuracy/loss are those of the last evaluation."""

    t: float
    version: int
    steps: int
    loss: float | None
    accuracy: float | None
    bytes_up: int
    bytes_down: int
    clients_online: int


@dataclass(slots=True, kw_only=True)
class RunResult:
    """One simulated run: where it sits in the sweep, its scenario and its outcome."""

    label: str
    point: dict[str, Any]
    scenario: dict[str, Any]
    summary: dict[str, Any]
    series: list[Sample] = field(default_factory=list)


def run_summary(
    *,
    mode: str,
    reason: str | None,
    virtual_seconds: float,
    seconds: float | None,
    steps: int,
    versions: int,
    loss: float | None,
    accuracy: float | None,
    time_to_target: float | None,
    linear_steps: int | None,
    linear_seconds: float | None,
    bytes_up: int,
    bytes_down: int,
    players: int,
) -> dict[str, Any]:
    """The summary fields every run mode reports, in results.json order; a mode
    appends its own counters after them."""
    speedup = linear_seconds / seconds if linear_seconds and seconds else None
    return {
        "mode": mode,
        "reason": reason,
        "virtual_seconds": virtual_seconds,
        "seconds": seconds,
        "steps": steps,
        "versions": versions,
        "loss": loss,
        "accuracy": accuracy,
        "time_to_target": time_to_target,
        "linear_steps": linear_steps,
        "linear_seconds": linear_seconds,
        "speedup": speedup,
        "bytes_up": bytes_up,
        "bytes_down": bytes_down,
        "bytes_per_client": (bytes_up + bytes_down) / max(1, players),
    }


def seed_figure(scenario: dict[str, Any]) -> float | None:
    """The seed's time for the experiment this scenario reproduces, if any.

    Only runs that match the seed's setup (8 players, 100 updates, tau 10,
    batch 16, a preset model) have a seed figure.
    """
    job = scenario["job"]
    preset = job["model"].get("preset")
    if (
        preset is None
        or scenario["clients"]["count"] != 8
        or scenario["run"].get("max_steps") != 100
        or job["strategy"]["tau"] != 10
        or job["data"]["batch"] != 16
    ):
        return None
    strategy = job["strategy"]["name"]
    latency = scenario["clients"]["latency"]
    if preset in SEED_CHUNKED:
        return SEED_CHUNKED[preset] if strategy == "decentral-async" else None
    if latency.get("kind") == "fixed" and latency["value"] > 0:
        if strategy != "decentral-async":
            return None
        return SEED_LATENCY.get(float(latency["value"]), {}).get(preset)
    return SEED_SECONDS.get(strategy, {}).get(preset)


def _clean(x: Any) -> Any:
    """JSON has no inf/nan: write them as null so the file stays standard."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def results_document(runs: Sequence[RunResult]) -> dict[str, Any]:
    return _clean(
        {
            "runs": [
                {
                    "label": r.label,
                    "point": r.point,
                    "scenario": r.scenario,
                    "summary": r.summary,
                    "seed_seconds": seed_figure(r.scenario),
                }
                for r in runs
            ]
        }
    )


def write_json(runs: Sequence[RunResult], path: Path) -> None:
    text = json.dumps(results_document(runs), indent=2, sort_keys=True, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def write_csv(runs: Sequence[RunResult], path: Path) -> None:
    names = [f.name for f in fields(Sample)]
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["run", *names])
        for r in runs:
            for s in r.series:
                row = asdict(s)
                w.writerow([r.label, *("" if row[n] is None else row[n] for n in names)])


def write_plots(runs: Sequence[RunResult], out: Path) -> list[Path]:
    """Three PNGs; imports matplotlib lazily (Agg) so the rest never needs a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = [
        ("accuracy.png", "test accuracy", lambda s: s.accuracy),
        ("bytes.png", "bytes sent, up + down (MB)", lambda s: (s.bytes_up + s.bytes_down) / 1e6),
        ("clients.png", "clients online", lambda s: s.clients_online),
    ]
    written = []
    for fname, ylabel, get in plots:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        lines = 0
        for r in runs:
            pts = [(s.t, get(s)) for s in r.series if get(s) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, label=r.label, linewidth=1.2)
                lines += 1
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if 0 < lines <= 12:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / fname
        # Fixed metadata: no timestamp or version in the file, so reruns compare equal.
        fig.savefig(path, metadata={"Software": None})
        plt.close(fig)
        written.append(path)
    return written


def _fmt(x: Any, spec: str = ".4g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return format(x, spec) if isinstance(x, int | float) else str(x)


def summary_markdown(runs: Sequence[RunResult]) -> str:
    first = runs[0].scenario if runs else {}
    lines = [f"# {first.get('name', 'simulation')}", ""]
    if first.get("description"):
        lines += [first["description"], ""]
    lines += [
        "| run | mode | stop | virtual s | steps | versions | accuracy | "
        "linear s | speedup | MB/client | seed s | seed speedup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        s = r.summary
        seed = seed_figure(r.scenario)
        preset = r.scenario["job"]["model"].get("preset")
        seed_lin = SEED_SECONDS["linear"].get(preset) if seed is not None else None
        lines.append(
            "| "
            + " | ".join(
                [
                    r.label,
                    s.get("mode", ""),
                    s.get("reason", ""),
                    _fmt(s.get("virtual_seconds")),
                    _fmt(s.get("steps")),
                    _fmt(s.get("versions")),
                    _fmt(s.get("accuracy"), ".3f"),
                    _fmt(s.get("linear_seconds")),
                    _fmt(s.get("speedup"), ".2f"),
                    _fmt((s.get("bytes_per_client") or 0) / 1e6, ".3g"),
                    _fmt(seed),
                    _fmt(seed_lin / seed if seed and seed_lin else None, ".2f"),
                ]
            )
            + " |"
        )
    sc = runs[0].scenario if runs else None
    if sc:
        lines += [
            "",
            "Compute rates assumed: a player "
            f"{_rate(sc['clients']['compute'])}{_frame(sc['clients'])}, one machine (linear) "
            f"{sc['server']['compute'] / 1e9:.3g} GFLOP/s. Speedup is against that "
            "machine doing every step itself. Seed figures: seed 004, tables 4.4, 4.6, "
            "4.7 and 4.8.",
        ]
        if any(r.summary.get("mode") == "cost" for r in runs):
            lines += [
                "",
                "Runs in mode `cost` are timings from the cost model only (transfer "
                "and compute times of the real schedule, no numerics); they have no "
                "accuracy.",
            ]
    return "\n".join(lines) + "\n"


def _frame(clients: dict[str, Any]) -> str:
    """The rate's qualifier when players compute inside a game's frame budget."""
    if clients.get("frame_budget_ms") is None:
        return ""
    return (
        f" inside a game at {clients['frame_budget_ms']:g} ms of each frame at "
        f"{clients['frame_hz']:g} Hz (x {clients['frame_share']:.3g})"
    )


def _rate(d: dict[str, Any]) -> str:
    kind = d.get("kind")
    if kind == "fixed":
        return f"{d['value'] / 1e9:.3g} GFLOP/s"
    if kind == "lognormal":
        return f"lognormal, median {d['median'] / 1e9:.3g} GFLOP/s, sigma {d['sigma']}"
    return json.dumps(d)


def write_report(runs: Sequence[RunResult], out_dir: str | Path, *, plots: bool = True) -> Path:
    """Write every artefact into ``out_dir`` (created); returns the directory."""
    if not runs:
        raise ValueError("report: no runs to write")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(runs, out / "results.json")
    write_csv(runs, out / "timeseries.csv")
    (out / "summary.md").write_text(summary_markdown(runs), encoding="utf-8")
    if plots:
        write_plots(runs, out)
    return out
