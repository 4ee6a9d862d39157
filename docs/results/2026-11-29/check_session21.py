"""Check docs/performance.md's session 21 figures against the files they came from:
each 700-player screen's times to threshold, best accuracy, results and MB per
volunteer-hour; that the 64-player rounds repeat session 20's curve; the replica
experiment's rounds and modelled seconds to 0.85; the huge preset's int2 screen; the
same-run benchmark's machine and crowd seconds and speedups.
Prints the mismatches (none expected) and the ratios to the machine's seeded times.
From the repository root:

    python docs/results/2026-11-29/check_session21.py
"""

import json
import sys

from published import HERE, check, check_counts, load_runs, write_ratios

#: tag: (seconds to each of THRESHOLDS, best), as docs/performance.md prints them
PUBLISHED = {
    "s21-int2-700": ([127, 147, 157, 213, 284], 0.913),
    "s21-int2-seed2-700": ([127, 147, 167, 218, 279], 0.913),
    "s21-shards128-700": ([117, 139, 155, 221, 292], 0.899),
    "s21-int2-shards128-700": ([114, 134, 144, 210, 285], 0.900),
    "s21-int2-shards128-seed2-700": ([114, 134, 149, 200, 260], 0.916),
    "s21-int2-seed3-700": ([122, 147, 162, 218, 258], 0.916),
    "s21-int2-shards128-seed3-700": ([109, 124, 144, 185, 250], 0.914),
}
#: tag: (results, MB per volunteer-hour)
COUNTS = {
    "s21-int2-700": (61600, 56),
    "s21-int2-seed2-700": (61600, 56),
    "s21-shards128-700": (57400, 63),
    "s21-int2-shards128-700": (62300, 53),
    "s21-int2-shards128-seed2-700": (62300, 53),
    "s21-int2-seed3-700": (61600, 56),
    "s21-int2-shards128-seed3-700": (62300, 53),
}
#: (replicas, codec up, codec down, tau, lr, batch, outer momentum, chain) ->
#: (rounds to 0.85, modelled seconds to it; None: not reached)
REPLICAS = {
    (64, "fp32", "exact", 104, 0.2, 16, 0.9, 16): (35, 385.2),
    (64, "int4-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (38, 227.8),
    (64, "int4-sr", "ef:int4-sr", 104, 0.2, 16, 0.9, 16): (38, 226.1),
    (64, "int2-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (45, 247.1),
    (64, "int2q-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (42, 231.9),
    (64, "topk:0.1+int8", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (52, 303.3),
    (64, "topk:0.05+int8", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (68, 362.4),
    (64, "topk:0.025+int8", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (None, None),
    (256, "int4-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (37, 222.4),
    (256, "int2-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (40, 221.8),
    (700, "int4-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (38, 227.8),
    (700, "int2-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (38, 211.7),
    (8, "int4-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (99, 564.9),
    (8, "int2-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 16): (None, None),
    (64, "int4-sr", "chain:int2-sr", 104, 0.2, 16, 0.9, 16): (None, None),
    (64, "int4-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 32): (38, 227.0),
    (64, "int4-sr", "chain:int4-sr", 104, 0.2, 16, 0.9, 1000): (40, 237.1),
    (64, "int4-sr", "chain:int4-sr", 90, 0.2, 16, 0.9, 16): (43, 234.4),
    (64, "int4-sr", "chain:int4-sr", 130, 0.2, 16, 0.9, 16): (36, 249.3),
    (64, "int4-sr", "chain:int4-sr", 156, 0.2, 16, 0.9, 16): (32, 251.7),
    (64, "int4-sr", "chain:int4-sr", 104, 0.15, 16, 0.9, 16): (43, 255.3),
    (64, "int4-sr", "chain:int4-sr", 104, 0.25, 16, 0.9, 16): (45, 266.2),
    (64, "int4-sr", "chain:int4-sr", 104, 0.3, 16, 0.9, 16): (62, 360.3),
    (64, "int4-sr", "chain:int4-sr", 104, 0.4, 16, 0.9, 16): (None, None),
    (64, "int4-sr", "chain:int4-sr", 52, 0.3, 32, 0.9, 16): (46, 271.7),
    (64, "int4-sr", "chain:int4-sr", 104, 0.2, 16, 0.8, 16): (39, 233.3),
}

#: benchmarks/roblox_700.py --rounds --shards 128 --virtual-s 460 [--seed N] --json: file ->
#: accuracy -> (the machine's s, the crowd's s, speedup to 2 places)
BENCH = {
    "roblox-700-rounds-shards128-session21.json": {
        "0.75": (692.7, 114.0, 6.08),
        "0.8": (1115.1, 144.0, 7.74),
        "0.85": (2145.8, 210.0, 10.22),
    },
    "roblox-700-rounds-shards128-seed2-session21.json": {
        "0.75": (692.7, 114.0, 6.08),
        "0.8": (1115.1, 149.0, 7.48),
        "0.85": (2145.8, 200.0, 10.73),
    },
}
#: the huge preset's screen: (results, seconds to loss 0.1, final loss to 3 places)
HUGE = {"h21-up2sr": (2176, 380.0, 0.061)}

runs = load_runs("roblox-screens-session21.json")
bad = check(runs, PUBLISHED) + check_counts(runs, COUNTS)
write_ratios(runs, list(PUBLISHED))
before = load_runs("roblox-screens-session20.json")["s20-strat-64"]
if runs["s21-rounds-64"]["curve"] != before["curve"]:
    sys.stdout.write("MISMATCH s21-rounds-64: its curve is not s20-strat-64's\n")
    bad += 1
seen = set()
for line in (HERE / "compressed-rounds-session21.json").read_text().splitlines():
    r = json.loads(line)
    key = (r["k"], r["up"], r["down"], r["h"], r["lr"], r["batch"], r["momentum"], r["chain"])
    if key not in REPLICAS:
        continue
    seen.add(key)
    got = (r["rounds_to"].get("0.85"), r["seconds_to"].get("0.85"))
    if got != REPLICAS[key]:
        sys.stdout.write(f"MISMATCH replicas {key}: {got}, published {REPLICAS[key]}\n")
        bad += 1
for key in REPLICAS.keys() - seen:
    sys.stdout.write(f"MISMATCH replicas {key}: no such run in the file\n")
    bad += 1
for tag, want in HUGE.items():
    h = load_runs("huge-64-session21.json")[tag]
    got = (h["results"], h["to"]["0.1"], round(h["loss"], 3))
    if got != want:
        sys.stdout.write(f"MISMATCH {tag}: {got}, published {want}\n")
        bad += 1
for name, rows in BENCH.items():
    table = {str(r["accuracy"]): r for r in json.loads((HERE / name).read_text())["table"]}
    for t, want in rows.items():
        r = table[t]
        got = (round(r["machine_s"], 1), r["crowd_s"], round(r["speedup"], 2))
        if got != want:
            sys.stdout.write(f"MISMATCH {name} at {t}: {got}, published {want}\n")
            bad += 1
sys.stdout.write(f"counts, the 64-player curve and {len(seen)} replica runs checked: ")
sys.stdout.write(f"{bad} mismatched in all\n")
sys.exit(1 if bad else 0)
