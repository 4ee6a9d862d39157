"""What the session checks (check_session18.py, check_session19.py) share: the
screens' JSON lines by tag, and each published row compared with its line."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
THRESHOLDS = ("0.75", "0.78", "0.8", "0.85", "0.88")


def load_runs(*names: str) -> dict[str, dict]:
    """Every line of the named JSON-lines files in this folder, by its tag."""
    runs = {}
    for name in names:
        for line in (HERE / name).read_text().splitlines():
            run = json.loads(line)
            runs[run["tag"]] = run
    return runs


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
