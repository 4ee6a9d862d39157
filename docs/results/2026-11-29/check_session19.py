"""Check docs/performance.md's session 19 figures against the JSON they came from:
each screen's published times to threshold and best accuracy, results, MB and MB
per volunteer-hour; the large preset's and the huge preset's figures from their
benchmarks' files. Prints the mismatches (none expected) and the ratios to the
machine's seeded times. From the repository root:

    python docs/results/2026-11-29/check_session19.py
"""

import json
import sys

from published import HERE, check, load_runs, mb_per_volunteer_hour, ratios

#: tag: (seconds to each of THRESHOLDS, best), as docs/performance.md prints them
PUBLISHED = {
    "s19-m95-64": ([200, 243, 272, 400, 656], 0.889),
    "s19-tau208-64": ([175, 207, 228, 334, 483], 0.901),
    "s19-up4sr-64": ([159, 178, 197, 272, 360], 0.920),
    "s19-up4sr-d4sr-64": ([141, 163, 185, 262, 354], 0.918),
    "s19-c4-tau78-64": ([130, 153, 181, 277, 373], 0.918),
    "s19-c4-tau52-64": ([141, 160, 182, 283, 461], 0.912),
    "s19-def-up4sr-8": ([394, 461, 548, 852, None], 0.854),
    "s19-new-default-64": ([201, 255, 288, 444, 697], 0.893),
    "s19-new-default-700": ([215, 264, 309, 463, None], 0.874),
    "s19-def-delta-8": ([384, 473, 519, 850, None], 0.855),
    "s19-def-delta-64": ([195, 240, 277, 417, 620], 0.896),
    "s19-def-delta-700": ([211, 257, 297, 419, None], 0.880),
    "s19-c4-8": ([354, 386, 431, 611, 895], 0.881),
    "s19-new-rcp-delta-64": ([141, 163, 185, 262, 354], 0.918),
    "s19-auto-deltas-64": ([141, 163, 185, 262, 354], 0.918),
    "s19-c4-700": ([147, 185, 207, 283, 398], 0.889),
    "s19-new-rcp-delta-churn-q05g05-64": ([235, 269, 302, 395, 542], 0.902),
}

runs = load_runs("roblox-screens-session19.json")
check(runs, PUBLISHED)
for tag in PUBLISHED:
    run = runs[tag]
    rate = mb_per_volunteer_hour(run)
    sys.stdout.write(f"{tag}: {ratios(run)} the machine; {rate:.0f} MB per volunteer-hour\n")

# The default's table: results and MB moved, as printed (MB rounded).
COUNTS = {
    "s19-def-up4sr-8": (2280, 355),
    "s19-def-delta-8": (2288, 264),
    "s19-new-default-64": (20928, 2831),
    "s19-def-delta-64": (21312, 2028),
    "s19-new-default-700": (149184, 20624),
    "s19-def-delta-700": (149773, 18859),
}
#: the rounds table's MB per volunteer-hour
RATES = {"s19-c4-8": 78, "s19-new-rcp-delta-64": 63, "s19-c4-700": 52}
RATES["s19-new-rcp-delta-churn-q05g05-64"] = 55
bad = 0
for tag, (results, mb) in COUNTS.items():
    run = runs[tag]
    if (run["results"], round(run["bytes"] / 1e6)) != (results, mb):
        sys.stdout.write(f"MISMATCH {tag}: {run['results']} results, {run['bytes']} bytes\n")
        bad += 1
for tag, rate in RATES.items():
    run = runs[tag]
    got = mb_per_volunteer_hour(run)
    if round(got) != rate:
        sys.stdout.write(f"MISMATCH {tag}: {got:.1f} MB per volunteer-hour, published {rate}\n")
        bad += 1

# The large preset (benchmarks/simulations.py): the roblox row at the job's codecs,
# seconds to losses 0.1 / 0.06 / 0.04, the ratios to the machine, the final loss.
LARGE = {
    "large-8-defaults-int4.json": ([171, 355, 355], [0.18, 0.14, 0.27], 0.0229),
    "large-8-defaults-int4-deltas.json": ([150, 291, 292], [0.20, 0.17, 0.33], 0.0216),
}
for name, (seconds, speedups, loss) in LARGE.items():
    row = next(
        r
        for r in json.loads((HERE / name).read_text())["speedup"]["rows"]
        if r["link"] == "roblox" and r["uploads"].startswith("the job's codecs")
    )
    eq = row["at_equal_loss"]
    got = (
        [int(v["crowd_s"]) for v in eq.values()],
        [round(v["speedup"], 2) for v in eq.values()],
        round(row["loss"], 4),
    )
    if got != (seconds, speedups, loss):
        sys.stdout.write(f"MISMATCH {name}: {got}\n")
        bad += 1

# The huge preset: the screens (results, to 0.1 / 0.041 / 0.036, best, final) and the
# benchmark's line (the server's loss, the crowd's time to it, the two speedups).
HUGE = {
    "h19-base": (1664, [420, 530, 550], 0.0335, 0.0364),
    "h19-up4sr": (2048, [340, 430, 450], 0.0341, 0.168),
    "h19-up4sr-e05v2000": (2048, [340, 430, 450], 0.0337, 0.052),
    "h19-up4sr-w1000e025v1700": (2048, [340, 470, 560], 0.0346, 0.0346),
    "h19-base-seed2": (1664, [400, 510, 530], 0.0351, 0.048),
    "h19-new-seed2": (2048, [330, 430, 470], 0.0347, 0.0347),
}
lines = [json.loads(x) for x in (HERE / "huge-64-session19.json").read_text().splitlines()]
for line in lines[:-1]:
    results, seconds, best, final = HUGE[line["tag"]]
    got = (
        line["results"],
        [int(line["to"][k]) for k in ("0.1", "0.041", "0.036")],
        round(min(v for _, v in line["curve"]), 4),
        round(line["loss"], 4 if line["loss"] < 0.05 else 3),
    )
    if got != (results, seconds, best, final):
        sys.stdout.write(f"MISMATCH {line['tag']}: {got}\n")
        bad += 1
h = lines[-1]["huge"]
got = (
    round(h["server"]["loss_at_virtual_s"], 4),
    h["crowd_s_to_server_loss"],
    round(h["speedup_to_server_loss"], 2),
    round(h["server_s_to_crowd_final_loss"]),
    round(h["speedup_at_crowd_final_loss"], 2),
    round(h["submodel"]["loss"], 4),
    round(h["whole"]["first_result_s"]),
)
if got != (0.0409, 470.0, 1.28, 780, 1.32, 0.0346, 1011):
    sys.stdout.write(f"MISMATCH the huge benchmark: {got}\n")
    bad += 1
sys.stdout.write(f"counts, rates, large and huge figures: {bad} mismatched\n")
