"""Session-wide test settings.

BLAS is capped at one thread (nn.threads explains why): several test processes
share two cores in CI, and results must not depend on a thread count.

Client processes keep fetched data shards under ``CROWDGRAD_CACHE_DIR``; the
tests point it at a temporary folder so that no run reads or fills a real cache.

``CROWDGRAD_REQUIRE_ALL=1`` (set by .ci/run) turns every skip into a failure: a
test that needs an optional component (chromium, node, two numba threads) must
run in CI, not pass silently by skipping.
"""

from __future__ import annotations

import os
import tempfile

import pytest

from nn.threads import set_threads

set_threads(1)

if "CROWDGRAD_CACHE_DIR" not in os.environ:
    os.environ["CROWDGRAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="crowdgrad-test-cache-")

REQUIRE_ALL = os.environ.get("CROWDGRAD_REQUIRE_ALL", "") not in ("", "0")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Under CROWDGRAD_REQUIRE_ALL a skip is reported as a failure, naming its reason."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CROWDGRAD_REQUIRE_ALL=1 (CI must run it): {reason}"
