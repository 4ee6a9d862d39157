"""A hypothesis state machine over random joins, results, duplicates, prefetches, drops
and ticks.

Invariants: no task is applied twice; every accepted result is in the model's
contribution count (or pending in a buffer/round); params stay finite; every
lease resolves once everyone has left; and replaying the same calls on a fresh
core with the same seed gives equal outputs and bitwise equal params.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from coordinator.core import events as ev
from coordinator.core.assembly import build_core
from coordinator.core.connections import ConnState
from coordinator.core.leases import LeaseState, TaskState
from coordinator.core.machine import Coordinator
from protocol import messages as m
from protocol.chunking import Block, chunk_params, iter_chunks, params_arrays, params_layout
from tests.coordinator.coord_helpers import digits, make_job

NAMES = ("c0", "c1", "c2", "c3")
#: the four strategies, and a layer-split job (decentral-async over two blocks)
STRATEGIES = ("central-sync", "central-async", "decentral-sync", "decentral-async", "layer-split")
#: in a layer-split job: who returns boundaries (lower tasks), who fetches shards (upper)
SPLIT_CAPS = {"c0": (True, True), "c1": (True, False), "c2": (False, True), "c3": (True, True)}


def _result(task: m.Task, value: float, rows: int = 0) -> list[m.Message]:
    """The result frames for ``task``: an update of ``value`` everywhere and, for a
    layer-split lower task, a boundary of ``rows`` rows (§3.3.2)."""
    from nn.params import Params

    update = np.full(task.spec.num_params, value, dtype=np.float32)
    delta = Params.from_flat(task.spec, update)
    if task.boundary is None:
        chunks = chunk_params(delta, max_message_bytes=1 << 20, transfer=task.task_id)
    else:
        h = np.full((rows, task.spec.widths[task.boundary]), abs(value), np.float32)
        layout = (*params_layout(task.spec), Block(task.spec.num_layers, "h", h.shape))
        chunks = list(
            iter_chunks(
                layout,
                [*params_arrays(delta), h],
                max_message_bytes=1 << 20,
                transfer=task.task_id,
            )
        )
    head = m.Result(
        task_id=task.task_id,
        model_version=task.model_version,
        kind=task.kind,
        num_chunks=len(chunks),
        samples=task.steps * task.batch,
        steps=task.steps,
        compute_seconds=0.01,
    )
    return [head, *chunks]


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core: Coordinator | None = None
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.outputs: list[ev.Output] = []
        self.now = 0.0
        self.online: set[str] = set()
        self.tokens: dict[str, str] = {}
        #: tasks each client holds, oldest first (a prefetch queues a second one)
        self.current: dict[str, list[m.Task]] = {}
        self.history: dict[str, list[m.Task]] = {n: [] for n in NAMES}
        #: a layer-split job (setup; a subclass's own setup leaves it off)
        self.split = False

    # -- driving -------------------------------------------------------------------

    @initialize(
        strategy=st.sampled_from(STRATEGIES),
        fedbuff=st.booleans(),
        seed=st.integers(0, 3),
    )
    def setup(self, strategy: str, fedbuff: bool, seed: int) -> None:
        self.split = strategy == "layer-split"
        split: dict[str, Any] = {}
        if self.split:  # one result per step: FedAsync, no window
            strategy, fedbuff = "decentral-async", False
            split = {"split": {"cut": 1}, "model": {"widths": [64, 16, 8, 10]}}
        self.job = make_job(
            strategy,
            **split,
            strategy={
                **({"window": 1} if self.split else {}),
                "clients_per_round": 2,
                "quorum": 0.5,
                "round_deadline_s": 15.0,
                "aggregation": "fedbuff" if fedbuff else "fedasync",
                "buffer_k": 2,
                "max_staleness": 3,
            },
            lease={"min_s": 10.0, "heartbeat_timeout_s": 40.0, "resume_grace_s": 20.0},
            validation={"max_rejections": 3, "norm_warmup": 2},
            checkpoint={"every_versions": 3},
        )
        self.seed = seed
        self.core = build_core(self.job, seed=seed, dataset=digits())

    def _call(self, method: str, *args: Any) -> list[ev.Output]:
        assert self.core is not None
        self.calls.append((method, args))
        out = getattr(self.core, method)(*args)
        self.outputs += out
        for o in out:
            match o:
                case ev.Send(message=m.Welcome() as w):
                    self.tokens[o.client_id] = w.resume_token
                case ev.Send(message=m.Task() as t):
                    self.current.setdefault(o.client_id, []).append(t)
                    self.history[o.client_id].append(t)
                case ev.Close():
                    self.online.discard(o.client_id)
                    self.current.pop(o.client_id, None)
        return out

    def _advance(self, dt: float) -> None:
        self.now += dt

    def _rows(self, task: m.Task) -> int:
        """A lower task's rows: its indices, or all of the shard it names (0: not
        a lower task)."""
        if task.boundary is None:
            return 0
        if task.indices is not None:
            return int(task.indices.size)
        assert self.core is not None
        return self.core.data.shard(task.shard).rows

    @rule(name=st.sampled_from(NAMES), dt=st.floats(0, 5), resume=st.booleans())
    def connect(self, name: str, dt: float, resume: bool) -> None:
        if name in self.online:
            return
        self._advance(dt)
        token = self.tokens.get(name) if resume else None
        self.online.add(name)
        boundary, data = SPLIT_CAPS[name] if self.split else (False, False)
        hello = m.Hello(client=name, flops=1e9, resume=token, boundary=boundary, data=data)
        self._call("connect", name, hello, self.now)

    @rule(name=st.sampled_from(NAMES), dt=st.floats(0, 5))
    def disconnect(self, name: str, dt: float) -> None:
        self._advance(dt)
        self.online.discard(name)
        self.current.pop(name, None)
        self._call("disconnect", name, self.now, "test")

    def _holder(self, start: int, *, history: bool) -> str | None:
        """The first online client from ``start`` on with a task (or any past task)."""
        for i in range(len(NAMES)):
            name = NAMES[(start + i) % len(NAMES)]
            has = self.history[name] if history else self.current.get(name)
            if name in self.online and has:
                return name
        return None

    @rule(
        start=st.integers(0, 3),
        dt=st.floats(0, 5),
        value=st.sampled_from([1e-3, -2e-3, 5e-4, 1e-3, 1.0, float("nan")]),
    )
    def send_result(self, start: int, dt: float, value: float) -> None:
        name = self._holder(start, history=False)
        if name is None:
            return
        tasks = self.current[name]
        task = tasks.pop(0)  # a client computes its tasks in the order they came
        if not tasks:
            del self.current[name]
        self._advance(dt)
        for msg in _result(task, value, self._rows(task)):
            if name in self.online:
                self._call("receive", name, msg, self.now)

    @rule(start=st.integers(0, 3), dt=st.floats(0, 5), pick=st.integers(0, 50))
    def resend_old_result(self, start: int, dt: float, pick: int) -> None:
        """A duplicate or late result for any task this client ever got."""
        name = self._holder(start, history=True)
        if name is None:
            return
        self._advance(dt)
        task = self.history[name][pick % len(self.history[name])]
        for msg in _result(task, 1e-3, self._rows(task)):
            if name in self.online:
                self._call("receive", name, msg, self.now)

    @rule(start=st.integers(0, 3), dt=st.floats(0, 5), stale=st.booleans())
    def prefetch(self, start: int, dt: float, stale: bool) -> None:
        """Ask for the next task while computing the oldest (or, stale, name an old one)."""
        name = self._holder(start, history=stale)
        if name is None:
            return
        self._advance(dt)
        task = self.history[name][0] if stale else self.current[name][0]
        self._call("receive", name, m.Prefetch(task_id=task.task_id), self.now)

    @rule(dt=st.floats(0, 30))
    def tick(self, dt: float) -> None:
        self._advance(dt)
        self._call("tick", self.now)

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def never_applied_twice(self) -> None:
        counts = Counter(o.task_id for o in self.outputs if isinstance(o, ev.ResultAccepted))
        assert all(c == 1 for c in counts.values()), counts
        if self.core is not None:
            book = self.core.book
            assert all(book.outcome(t) is TaskState.ACCEPTED for t in counts)
            # resolved tasks leave the book with their leases: it holds open work only
            assert all(t.state is TaskState.OPEN for t in book.tasks.values())
            assert {x.task_id for x in book.leases.values()} <= set(book.tasks)

    @invariant()
    def accepted_results_are_counted(self) -> None:
        if self.core is None:
            return
        accepted = sum(isinstance(o, ev.ResultAccepted) for o in self.outputs)
        assert self.core.model.contributions + self.core.strategy.pending() == accepted
        assert self.core.accepted_results == accepted

    @invariant()
    def params_finite(self) -> None:
        if self.core is not None:
            assert self.core.params.is_finite()

    @invariant()
    def one_live_lease_per_client_and_at_most_one_queued(self) -> None:
        if self.core is None:
            return
        book = self.core.book
        live = Counter(x.client_id for x in book.leases.values() if x.live)
        for client_id, n in live.items():
            queued = book.queued_lease_of(client_id)
            assert n == 1 + (queued is not None), (client_id, n)
            assert queued is None or self.core.strategy.pipelined
        assert set(live) <= set(self.core.conns)

    @invariant()
    def connection_phases_agree_with_the_lease_book(self) -> None:
        """READY holds no lease; WORKING and PREFETCH hold a live one, PREFETCH
        with nothing queued behind it (coordinator/core/connections.py)."""
        if self.core is None:
            return
        book = self.core.book
        for client_id, conn in self.core.conns.items():
            live, queued = book.live_lease_of(client_id), book.queued_lease_of(client_id)
            if conn.state is ConnState.READY:
                assert live is None and queued is None, client_id
            else:
                assert conn.state in (ConnState.WORKING, ConnState.PREFETCH), conn.state
                assert live is not None, client_id
                assert conn.state is ConnState.WORKING or queued is None, client_id

    def teardown(self) -> None:
        if self.core is None:
            return
        for name in NAMES:
            self._call("disconnect", name, self.now + 1, "teardown")
        self._call("tick", self.now + 1000.0)
        book = self.core.book
        assert book.all_resolved()
        assert all(x.state is not LeaseState.LEASED for x in book.leases.values())
        assert all(
            t.state is not TaskState.OPEN or t.round is not None for t in book.tasks.values()
        )
        # replay: same seed, same calls -> same outputs, bitwise same params
        again = build_core(self.job, seed=self.seed, dataset=digits())
        outs: list[ev.Output] = []
        for method, args in self.calls:
            outs += getattr(again, method)(*args)
        assert outs == self.outputs
        assert again.params.array_equal(self.core.params)


CoreMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoreMachine = CoreMachine.TestCase
