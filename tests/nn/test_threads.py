"""nn.threads: thread counts from the environment and the OpenMP wait policy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nn import threads


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, {"GOMP_SPINCOUNT": str(threads.OMP_SPIN_COUNT)}),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "PASSIVE"}),  # the user's
        ({"GOMP_SPINCOUNT": "7"}, {"GOMP_SPINCOUNT": "7"}),
    ],
)
def test_omp_spin_is_bounded_unless_the_user_chose(monkeypatch, env, want) -> None:
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    threads.bound_omp_spin()
    got = {n: os.environ[n] for n in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if n in os.environ}
    assert got == want


def test_importing_the_kernels_bounds_the_spin_before_openmp_loads() -> None:
    code = (
        "import os\n"
        "os.environ.pop('OMP_WAIT_POLICY', None); os.environ.pop('GOMP_SPINCOUNT', None)\n"
        "import nn.kernels\n"
        "maps = open('/proc/self/maps').read() if os.path.exists('/proc/self/maps') else ''\n"
        "print(os.environ.get('GOMP_SPINCOUNT'), 'libgomp' in maps)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(threads.OMP_SPIN_COUNT), "False"]


def test_default_threads_reads_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("CROWDGRAD_THREADS", "3")
    assert threads.default_threads() == 3
    for bad in ("0", "two"):
        monkeypatch.setenv("CROWDGRAD_THREADS", bad)
        with pytest.raises(ValueError, match="CROWDGRAD_THREADS"):
            threads.default_threads()
