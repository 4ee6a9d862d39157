"""What the session checks (check_session18-21.py) share: the
screens' JSON lines by tag, and each published row compared with its line."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
THRESHOLDS = ("0.75", "0.78", "0.8", "0.85", "0.88")
#: the one machine's seeded virtual seconds to each accuracy (sessions 17-20)
MACHINE = {"0.75": 718.0, "0.78": 938.0, "0.8": 1250.0, "0.85": 2095.0}


def load_runs(*names: str) -> dict[str, dict]:
    """Every line of the named JSON-lines files in this folder, by its tag."""
    runs = {}
    for name in names:
        for line in (HERE / name).read_text().splitlines():
            run = json.loads(line)
            runs[run["tag"]] = run
    return runs


def ratios(run: dict) -> str:
    """The machine's seconds over the run's, per MACHINE threshold ("—": not reached)."""
    return " / ".join(
        "—" if run["to"][t] is None else f"{MACHINE[t] / run['to'][t]:.2f}x" for t in MACHINE
    )


def mb_per_volunteer_hour(run: dict) -> float:
    """Bytes both ways over the players' hours in the run (to its last sample)."""
    return run["bytes"] / 1e6 / (run["players"] * run["curve"][-1][0] / 3600)


def check(runs: dict[str, dict], published: dict[str, tuple[list, float]]) -> int:
    """Write each row whose seconds to THRESHOLDS or best accuracy differ from its
    run's, then the count; returns the number mismatched."""
    bad = 0
    for tag, (seconds, best) in published.items():
        run = runs[tag]
        got = [None if run["to"].get(t) is None else int(run["to"][t]) for t in THRESHOLDS]
        if got != seconds or abs(run["best"] - best) > 0.0011:
            sys.stdout.write(f"MISMATCH {tag}: {got} {run['best']}, published {seconds} {best}\n")
            bad += 1
    sys.stdout.write(f"{len(published)} rows checked, {bad} mismatched\n")
    return bad


def check_counts(runs: dict[str, dict], counts: dict[str, tuple[int, int]]) -> int:
    """Write each run whose (results, MB per volunteer-hour) differ from ``counts``;
    returns the number mismatched."""
    bad = 0
    for tag, (results, rate) in counts.items():
        run = runs[tag]
        got = (run["results"], round(mb_per_volunteer_hour(run)))
        if got != (results, rate):
            sys.stdout.write(f"MISMATCH {tag}: results, MB/h {got}, published {(results, rate)}\n")
            bad += 1
    return bad


def write_ratios(runs: dict[str, dict], tags: list[str]) -> None:
    for tag in tags:
        sys.stdout.write(f"{tag}: {ratios(runs[tag])} the machine\n")
