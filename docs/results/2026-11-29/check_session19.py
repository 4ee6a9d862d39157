"""Check docs/performance.md's session 19 tables against the screens' JSON lines:
each published time to threshold and best accuracy, the ratios to the machine's
seeded 2,095 s to 0.85 and the MB per volunteer-hour. Prints the mismatches (none
expected) and the ratios. From the repository root:

    python docs/results/2026-11-29/check_session19.py
"""

import sys

from published import check, load_runs

MACHINE = {"0.75": 718.0, "0.78": 938.0, "0.8": 1250.0, "0.85": 2095.0}
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
    ratios = " / ".join(
        "—" if run["to"][t] is None else f"{MACHINE[t] / run['to'][t]:.2f}x" for t in MACHINE
    )
    hours = run["players"] * run["curve"][-1][0] / 3600
    rate = run["bytes"] / 1e6 / hours
    sys.stdout.write(f"{tag}: {ratios} the machine; {rate:.0f} MB per volunteer-hour\n")
