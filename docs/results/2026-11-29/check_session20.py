"""Check docs/performance.md's session 20 figures against the files they came from:
each screen's times to threshold, best accuracy, results and MB per volunteer-hour;
the round-close logs' round lengths; the overlap experiment's rounds to each
accuracy. Prints the mismatches (none expected) and the ratios to the machine's
seeded times. From the repository root:

    python docs/results/2026-11-29/check_session20.py
"""

import itertools
import json
import re
import sys

from published import HERE, check, check_counts, load_runs, write_ratios

#: tag: (seconds to each of THRESHOLDS, best), as docs/performance.md prints them
PUBLISHED = {
    "s20-strat-700": ([136, 163, 179, 234, 289], 0.911),
    "s20-strat-64": ([141, 158, 174, 240, 327], 0.920),
    "s20-old-seed2-64": ([136, 152, 174, 234, 327], 0.919),
    "s20-strat-seed2-64": ([141, 163, 179, 251, 333], 0.915),
    "s20-strat-churn-q05g05-64": ([227, 261, 286, 404, 551], 0.909),
    "s20-strat-8": ([354, 386, 431, 611, 895], 0.881),
    "s20-default-8": ([384, 473, 519, 850, None], 0.855),
    "s20-mom002-64": ([141, 169, 190, 256, 338], 0.924),
    "s20-mom004-64": ([415, 803, None, None, None], 0.783),
    "s20-adam001-64": ([147, 240, None, None, None], 0.798),
    "s20-old-seed2-700": ([147, 185, 201, 283, 409], 0.893),
    "s20-strat-seed2-700": ([136, 158, 174, 234, 300], 0.904),
}
#: tag: (results, MB per volunteer-hour)
COUNTS = {
    "s20-strat-700": (56700, 65),
    "s20-old-seed2-700": (44100, 52),
    "s20-strat-64": (10304, 63),
    "s20-strat-churn-q05g05-64": (4987, 55),
    "s20-strat-8": (1120, 78),
}
#: round-close logs: (rounds closed, the longest round in s, rounds longer than 6.5 s)
LOGS = {
    "rounds-700-before-session20.log": (16, 21.7, 1),
    "rounds-700-after-session20.log": (19, 6.3, 0),
}
#: the overlap experiment: (mode, LOOK, outer lr) -> rounds to 0.75 / 0.78 / 0.80 / 0.85
OVERLAP = {
    ("sync", 0.0, "auto"): [21, 25, 27, 35],
    ("delay", 0.0, "0.25"): [55, 65, 74, 100],
    ("delay", 0.5, "0.38"): [45, 52, 58, 75],
    ("eager", 0.0, "auto"): [92, 114, 120, 137],
    ("eager", 0.0, "0.38"): [37, 46, 58, 99],
}

runs = load_runs("roblox-screens-session20.json")
bad = check(runs, PUBLISHED) + check_counts(runs, COUNTS)
write_ratios(runs, list(PUBLISHED))
for name, want in LOGS.items():
    times = [float(t) for t in re.findall(r" t=([0-9.]+)", (HERE / name).read_text())]
    lengths = [b - a for a, b in itertools.pairwise(times)]
    got = (len(times), round(max(lengths), 1), sum(x > 6.5 for x in lengths))
    if got != want:
        sys.stdout.write(f"MISMATCH {name}: {got}, published {want}\n")
        bad += 1
for line in (HERE / "overlap-rounds-session20.json").read_text().splitlines():
    run = json.loads(line)
    key = (run["mode"], run["look"], run["outer_lr"])
    got = [run["rounds_to"].get(t) for t in ("0.75", "0.78", "0.8", "0.85")]
    if OVERLAP.get(key) != got:
        sys.stdout.write(f"MISMATCH overlap {key}: {got}, published {OVERLAP.get(key)}\n")
        bad += 1
sys.stdout.write(f"counts, logs and the overlap experiment checked: {bad} mismatched in all\n")
sys.exit(1 if bad else 0)
