"""What a replicated task's two copies prove: agreement, and on a disagreement each
copy's verdict by the coordinator's own run and the copies' kernel families.

Pure functions on update arrays, used by ``replication.Replicator`` and by
benchmarks/replicas.py, so that the benchmark applies the coordinator's rule
itself. A §12 kernel family (``hello.kernel``, docs/protocol.md §3.1) is bit-exact
with itself, so two copies of one family that differ prove one of them wrong;
copies of different families may part by rounding over a long task, so the own
run (numba's) proves a copy wrong only where it computes as that copy's family
does. The rule and its measured grounds: docs/coordinator.md ("Adaptive
replication"), docs/performance.md ("Honest replicas across implementations").
"""

from __future__ import annotations

import enum

import numpy as np

from client.compute import KERNEL
from protocol import messages as m

#: the kernel family of the coordinator's own run (``client.compute.run_task``: numba,
#: float32 BLAS sums; protocol.messages.KERNELS)
OWN_KERNEL = KERNEL


def family(kernel: str) -> str:
    """A ``hello.kernel`` token as replication counts it: a family of
    ``protocol.messages.KERNELS``, or "" (unknown: judged as the coordinator's own)."""
    return kernel if kernel in m.KERNELS else ""


def may_take(holder_kernel: str, taker_kernel: str, waited_s: float, wait_s: float) -> bool:
    """Whether a client of ``taker_kernel`` may take the twin of a primary whose holder
    computes with ``holder_kernel`` (families), ``waited_s`` after it was leased: one of
    the same family, any client once the holder's is unknown or the unit has waited
    ``wait_s`` (so that a unit of a family no idle client has is still checked)."""
    return not holder_kernel or taker_kernel == holder_kernel or waited_s >= wait_s


class Verdict(enum.Enum):
    """What the coordinator's own run says of one copy of a disagreeing pair."""

    RIGHT = "right"  # it agrees with the own run, or is the nearer of one family's two
    WRONG = "wrong"  # proven wrong: not used, its holder struck
    INCONCLUSIVE = "inconclusive"  # off the own run, but its family may be: not used, no strike


def judge(
    a: np.ndarray,
    b: np.ndarray,
    own: np.ndarray,
    *,
    kernels: tuple[str, str],
    rtol: float,
    atol: float,
    distance: float,
) -> tuple[Verdict, Verdict]:
    """Verdicts on two copies that disagree with each other (``agree`` failed), given
    the coordinator's own result ``own`` and each copy's kernel family (``family``).

    - Both of one family other than the coordinator's: that family is bit-exact with
      itself, so one of them is wrong. The one nearer ``own`` (L2 distance; ``a`` on
      a tie) is right; the other is wrong if it also disagrees with ``own``, else
      right too.
    - Otherwise each alone: a copy that agrees with ``own`` is right; one that does
      not is wrong if its family is the coordinator's or unknown, and inconclusive if
      it is another (its rounding may part from ``own`` over a long task).
    """
    tol = {"rtol": rtol, "atol": atol, "distance": distance}
    ka, kb = kernels
    a_ok, b_ok = agree(a, own, **tol), agree(b, own, **tol)
    if ka == kb and ka not in ("", OWN_KERNEL):
        a_near = _dist(a, own) <= _dist(b, own)
        a_ok, b_ok = a_ok or a_near, b_ok or not a_near
        return (Verdict.RIGHT if a_ok else Verdict.WRONG, Verdict.RIGHT if b_ok else Verdict.WRONG)

    def alone(ok: bool, kernel: str) -> Verdict:
        if ok:
            return Verdict.RIGHT
        return Verdict.WRONG if kernel in ("", OWN_KERNEL) else Verdict.INCONCLUSIVE

    return alone(a_ok, ka), alone(b_ok, kb)


def _dist(a: np.ndarray, b: np.ndarray) -> float:
    d = a.astype(np.float64) - b.astype(np.float64)
    return float(np.sqrt(d @ d))


def shift_check(bits: int, struck: bool, window: int) -> int:
    """A client's last ``window`` checked results as bits (1: struck, newest lowest),
    after one more; ``.bit_count()`` of it is its strikes in the window."""
    return ((bits << 1) | int(struck)) & ((1 << window) - 1)


def agree(a: np.ndarray, b: np.ndarray, *, rtol: float, atol: float, distance: float = 0.0) -> bool:
    """Every value within ``atol + rtol · max(|a|, |b|)`` (float64, no overflow), or
    the whole within ``distance`` of the longer in relative L2: an activation that
    flips on a rounding difference sends a few values far and leaves the update
    where it was, where a lie (a sign flip, a scale, noise, zeros) moves all of it."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = np.abs(a64 - b64)
    if bool(np.all(diff <= atol + rtol * np.maximum(np.abs(a64), np.abs(b64)))):
        return True
    if distance <= 0:
        return False
    longer = max(float(np.sqrt(a64 @ a64)), float(np.sqrt(b64 @ b64)))
    return float(np.sqrt(diff @ diff)) <= distance * longer
