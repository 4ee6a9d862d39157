"""Check docs/performance.md's session 18 tables against the screens' JSON lines:
each published time to threshold and best accuracy, and the ratios to the
machine's seeded 2,095 s to 0.85. Prints the mismatches (none expected) and the
ratios. From the repository root:

    python docs/results/2026-11-29/check_session18.py
"""

import sys

from published import check, load_runs

MACHINE_085 = 2095.0
#: tag: (seconds to each of THRESHOLDS, best), as docs/performance.md prints them
PUBLISHED = {
    "s18-rcp-4": ([708, 794, 886, None, None], 0.804),
    "s18-default-4": ([582, 671, 778, None, None], 0.821),
    "s18-rcp-8": ([407, 457, 514, 699, None], 0.866),
    "s18-rcp-16": ([271, 320, 342, 477, 691], 0.896),
    "s18-default-16": ([307, 364, 435, 666, None], 0.873),
    "s18-rcp-64": ([172, 200, 236, 314, 407], 0.914),
    "s18-rcp-700": ([181, 226, 247, 335, None], 0.879),
    "s18-default-churn-64": ([355, 430, 506, 726, None], 0.869),
    "s18-rcp-churn-64": ([568, 731, 812, None, None], 0.817),
    "s18-rcp-churn-d12-64": ([337, 385, 421, 565, 745], 0.895),
    "s18-o13-churn-d12-64": ([337, 385, 445, 577, 757], 0.893),
    "s18-default-churn-8": ([461, 523, 651, None, None], 0.833),
    "s18-rcp-churn-8": ([609, 716, 805, None, None], 0.82),
    "s18-rcp-churn-d12-8": ([702, 767, 837, None, None], 0.821),
    "s18-o07-churn-d12-8": ([674, 758, 785, None, None], 0.819),
    "s18-rcp-churn-g05-64": ([348, 403, 459, 631, 816], 0.887),
    "s18-rcp-churn-g025-64": ([305, 349, 383, 541, 723], 0.893),
    "s18-rcp-churn-q05g05-64": ([284, 326, 371, 492, 643], 0.897),
    "s18-rcp-churn-q05g025-64": ([243, 279, 323, 482, 695], 0.896),
}

runs = load_runs("roblox-screens-session18.json", "lan-screens-session18.json")
check(runs, PUBLISHED)
for tag in ("s18-rcp-8", "s18-rcp-16", "s18-rcp-64", "s18-rcp-700", "s18-rcp-churn-q05g05-64"):
    sys.stdout.write(f"{tag}: {MACHINE_085 / runs[tag]['to']['0.85']:.2f}x the machine to 0.85\n")
share = runs["s18-rcp-churn-q05g05-64"]["bytes"] / runs["s18-default-churn-64"]["bytes"]
sys.stdout.write(f"bytes, quorum 0.5 grace 0.5 against the default under churn: {share:.0%}\n")
