"""The one-machine anchor of a job: what the operator's own machine does alone.

Every crowd is judged against it (docs/performance.md, "The crowd against the
machine"): the job's own data, model, batch, held-out rows and client
optimizer, trained on this machine for a wall-clock budget, with the thread
count that trains fastest here and, with a grid, the optimizer and lr that
reach the best accuracy in a short trial, and the job's reduce-on-plateau
schedule (``strategy.plateau_*``, the crowd's own) or a constant lr, whichever
ends the budget higher. Its history has the shape of the
coordinator's ``/api/history`` evaluations (seconds, accuracy, loss), so the
two are compared point by point. Seconds are training seconds: evaluations are
not counted against the machine, as they cost the coordinator nothing either
in its clients' time.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from coordinator.core.config import JobConfig
from coordinator.core.data import load_job_data
from coordinator.core.strategies.plateau import LrPlateau
from nn.data import Dataset
from nn.optim import Optimizer, OptState
from nn.spec import ModelSpec
from nn.threads import set_threads
from nn.train import evaluate, train_steps

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Point:
    """One evaluation: training seconds so far, optimizer steps, held-out figures."""

    t: float
    steps: int
    accuracy: float | None
    loss: float


def time_to(curve: Sequence[tuple[float, float | None]], accuracy: float) -> float | None:
    """Seconds until a ``(seconds, accuracy)`` curve first reached ``accuracy``."""
    for t, a in curve:
        if a is not None and a >= accuracy:
            return t
    return None


def accuracy_at(curve: Sequence[tuple[float, float | None]], seconds: float) -> float | None:
    """The last accuracy of a ``(seconds, accuracy)`` curve at or before ``seconds``."""
    acc = None
    for t, a in curve:
        if t > seconds:
            break
        acc = a
    return acc


def settled_accuracy(curve: Sequence[tuple[float, float | None]], t_end: float) -> float:
    """Where a curve ended at ``t_end``: the mean accuracy of its last tenth (one
    evaluation moves by a point or more)."""
    tail = [a for t, a in curve if t >= 0.9 * t_end and a is not None]
    if not tail:
        return accuracy_at(curve, t_end) or 0.0
    return sum(tail) / len(tail)


@dataclass(frozen=True, slots=True)
class Plateau:
    """Reduce-on-plateau: the lr times ``factor`` each time the held-out loss has
    not reached a new best for ``patience`` evaluations, down to ``minimum`` of
    the start (the crowd's rule, coordinator/core/strategies/plateau.py, counting
    each evaluation as a round)."""

    patience: int
    factor: float
    minimum: float

    @classmethod
    def of(cls, job: JobConfig) -> Plateau | None:
        """The job's schedule (``strategy.plateau_*``); None when it has none."""
        st = job.strategy
        if st.plateau_patience == 0:
            return None
        return cls(st.plateau_patience, st.plateau_factor, st.plateau_min)


@dataclass(slots=True)
class AnchorRun:
    """One optimizer setting trained for a budget; ``history`` in time order."""

    optimizer: dict
    threads: int
    batch: int
    history: list[Point] = field(default_factory=list)
    #: the lr schedule: None for a constant lr
    plateau: Plateau | None = None
    #: training seconds at which the schedule cut the lr
    cuts: list[float] = field(default_factory=list)

    @property
    def best_accuracy(self) -> float | None:
        accs = [p.accuracy for p in self.history if p.accuracy is not None]
        return max(accs) if accs else None

    @property
    def final_accuracy(self) -> float | None:
        return self.history[-1].accuracy if self.history else None

    @property
    def best_loss(self) -> float:
        return min((p.loss for p in self.history), default=float("inf"))

    @property
    def curve(self) -> list[tuple[float, float | None]]:
        return [(p.t, p.accuracy) for p in self.history]

    @property
    def settled_accuracy(self) -> float:
        """Where the run ended (``settled_accuracy`` of its curve)."""
        if not self.history:
            return 0.0
        return settled_accuracy(self.curve, self.history[-1].t)

    def time_to(self, accuracy: float) -> float | None:
        """Training seconds until the held-out accuracy first reached ``accuracy``."""
        return time_to(self.curve, accuracy)

    def accuracy_at(self, seconds: float) -> float | None:
        """The last accuracy measured at or before ``seconds``."""
        return accuracy_at(self.curve, seconds)

    def to_json(self) -> dict:
        return {
            "optimizer": self.optimizer,
            "threads": self.threads,
            "batch": self.batch,
            "best_accuracy": self.best_accuracy,
            "final_accuracy": self.final_accuracy,
            "plateau": None if self.plateau is None else asdict(self.plateau),
            "lr_cuts_s": self.cuts,
            "history": [asdict(p) for p in self.history],
        }


def job_optimizer(job: JobConfig) -> Optimizer:
    """The optimizer the job's clients train with."""
    st = job.strategy
    return Optimizer(kind=st.client_optimizer, lr=st.lr, momentum=st.momentum)


def grid_of(base: Optimizer) -> list[Optimizer]:
    """The settings a grid tries: the job's own, and SGD, momentum and Adam at lrs
    that bracket it (x 1/4 .. x 4 for SGD; momentum and Adam at their usual scale)."""
    out = [base]
    for f in (0.25, 0.5, 2.0, 4.0):
        out.append(Optimizer(kind="sgd", lr=base.lr * f))
    for f in (0.1, 0.2, 0.5):
        out.append(Optimizer(kind="momentum", lr=base.lr * f, momentum=0.9))
    for lr in (3e-4, 1e-3, 3e-3):
        out.append(Optimizer(kind="adam", lr=lr))
    seen: list[Optimizer] = []
    for o in out:
        if o not in seen:
            seen.append(o)
    return seen


def train_for(
    spec: ModelSpec,
    ds: Dataset,
    optimizer: Optimizer,
    *,
    seconds: float,
    batch: int,
    seed: int,
    eval_every_s: float = 0.5,
    max_eval_rows: int | None = None,
    threads: int = 1,
    plateau: Plateau | None = None,
    on_point: Callable[[Point], None] | None = None,
) -> AnchorRun:
    """Train from the job's initial weights for ``seconds`` of training time,
    evaluating on the held-out rows every ``eval_every_s`` (and, with a
    ``plateau``, cutting the lr on the held-out loss as the crowd does)."""
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    set_threads(threads)
    params = spec.init_params(seed)
    state = OptState.init(optimizer, spec)
    rng = np.random.default_rng(seed)
    X_test, y_test = ds.X_test, ds.y_test
    if max_eval_rows is not None:
        X_test, y_test = X_test[:max_eval_rows], y_test[:max_eval_rows]
    train_steps(
        params.copy(), OptState.init(optimizer, spec), ds.X_train, ds.y_train, 1, batch, rng
    )
    run = AnchorRun(optimizer=optimizer.to_dict(), threads=threads, batch=batch, plateau=plateau)
    start = evaluate(params, X_test, y_test).loss  # a loss 10x above it: diverged
    cuts = None if plateau is None else LrPlateau(plateau.patience, plateau.factor, plateau.minimum)
    spent, steps, chunk = 0.0, 0, 8
    next_eval = eval_every_s
    while spent < seconds:
        t0 = time.perf_counter()
        train_steps(params, state, ds.X_train, ds.y_train, chunk, batch, rng)
        dt = time.perf_counter() - t0
        spent += dt
        steps += chunk
        # chunks of about half the evaluation cadence: each call checks and
        # permutes the whole training set, a cost a short chunk would feel
        chunk = max(1, min(chunk * 2, int(chunk * (eval_every_s / 2) / max(dt, 1e-6)) or 1))
        if spent >= next_eval or spent >= seconds:
            ev = evaluate(params, X_test, y_test)
            point = Point(t=round(spent, 4), steps=steps, accuracy=ev.accuracy, loss=ev.loss)
            run.history.append(point)
            if on_point is not None:
                on_point(point)
            next_eval = spent + eval_every_s
            if not ev.loss < 10 * start:  # (NaN too) diverged: nothing more to learn here
                break
            # the machine's rounds are its evaluations
            if cuts is not None and cuts.observe(ev.loss, len(run.history)):
                state.optimizer = replace(optimizer, lr=optimizer.lr * cuts.decay)
                run.cuts.append(point.t)
    return run


def fastest_threads(
    spec: ModelSpec, ds: Dataset, batch: int, *, candidates: Sequence[int], probe_s: float = 0.3
) -> tuple[int, dict[int, float]]:
    """The thread count that trains the most steps a second here (small models
    often train fastest on one)."""
    rates: dict[int, float] = {}
    for n in candidates:
        set_threads(n)
        params = spec.init_params(0)
        state = OptState.init(Optimizer(), spec)
        rng = np.random.default_rng(0)
        train_steps(params, state, ds.X_train, ds.y_train, 4, batch, rng)  # warm-up
        steps, t0 = 0, time.perf_counter()
        while (spent := time.perf_counter() - t0) < probe_s:
            train_steps(params, state, ds.X_train, ds.y_train, 256, batch, rng)
            steps += 256
        rates[n] = steps / spent
    best = max(rates, key=lambda n: rates[n])
    return best, rates


def thread_candidates(threads: int | None) -> list[int]:
    """``threads``, or 1..cores (``None``)."""
    if threads is not None:
        return [threads]
    return list(range(1, (os.cpu_count() or 1) + 1))


@dataclass(slots=True)
class Anchor:
    """The anchor's result: the chosen run and every trial the grid made."""

    job: str
    run: AnchorRun
    trials: list[AnchorRun]
    thread_rates: dict[int, float]
    #: the chosen setting's full-budget runs, one per lr schedule tried
    finals: list[AnchorRun] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "job": self.job,
            "best": self.run.to_json(),
            "trials": [
                {"optimizer": t.optimizer, "best_accuracy": t.best_accuracy} for t in self.trials
            ],
            "thread_rates": {str(k): round(v, 1) for k, v in self.thread_rates.items()},
            "finals": [
                {
                    "plateau": None if f.plateau is None else asdict(f.plateau),
                    "settled_accuracy": round(f.settled_accuracy, 4),
                    "best_accuracy": f.best_accuracy,
                }
                for f in self.finals
            ],
        }


def anchor_of(
    job: JobConfig,
    *,
    seconds: float,
    grid: bool = False,
    grid_seconds: float | None = None,
    threads: int | None = None,
    eval_every_s: float = 0.5,
    on_point: Callable[[Point], None] | None = None,
    on_trial: Callable[[AnchorRun], None] | None = None,
) -> Anchor:
    """The one machine at its best on ``job``: the fastest thread count, then
    (``grid``) every setting of ``grid_of`` for ``grid_seconds`` each, and the
    best of them (highest accuracy, then lowest loss) for ``seconds``: with the
    job's plateau schedule and, with ``grid``, also at a constant lr, the run
    that ends higher (``settled_accuracy``) kept. Without ``grid``: the job's own
    optimizer and schedule."""
    ds = load_job_data(job)
    spec = job.spec
    batch, seed = job.data.batch, job.model.init_seed
    best_threads, rates = fastest_threads(spec, ds, batch, candidates=thread_candidates(threads))
    base = job_optimizer(job)
    trials: list[AnchorRun] = []
    choice = base
    if grid:
        trial_s = grid_seconds if grid_seconds is not None else max(seconds / 4, 1.0)
        for opt in grid_of(base):
            t = train_for(
                spec, ds, opt, seconds=trial_s, batch=batch, seed=seed,
                eval_every_s=eval_every_s, max_eval_rows=job.eval.max_samples,
                threads=best_threads,
            )  # fmt: skip
            trials.append(t)
            if on_trial is not None:
                on_trial(t)
        top = max(trials, key=lambda t: (t.best_accuracy or 0.0, -t.best_loss))
        choice = Optimizer.from_dict(top.optimizer)
    schedules = [Plateau.of(job)]
    if grid and schedules[0] is not None:
        schedules.append(None)
    finals = []
    for plateau in schedules:
        finals.append(train_for(
            spec, ds, choice, seconds=seconds, batch=batch, seed=seed,
            eval_every_s=eval_every_s, max_eval_rows=job.eval.max_samples,
            threads=best_threads, plateau=plateau, on_point=on_point,
        ))  # fmt: skip
    run = max(finals, key=lambda r: r.settled_accuracy)
    return Anchor(job=job.data.source, run=run, trials=trials, thread_rates=rates, finals=finals)
