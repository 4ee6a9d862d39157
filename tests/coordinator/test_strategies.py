"""Strategies driven directly (no core): scheduling and maths per method."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.config import DataSection, StrategySection
from coordinator.core.leases import LeaseBook, TaskState
from coordinator.core.strategies import (
    STRATEGIES,
    ClientView,
    ModelState,
    ShardCursor,
    make_strategy,
)
from coordinator.core.strategies.aggregate import OuterOptimizer, nesterov_edge
from nn.spec import ModelSpec

SPEC = ModelSpec(widths=(3, 2))


def build(name: str, **cfg):
    model = ModelState(params=SPEC.init_params(0))
    s = make_strategy(
        model=model,
        config=StrategySection(name=name, **cfg),
        data=DataSection(shards=3, batch=4),
        rng=np.random.default_rng(0),
    )
    return s, model


def view(cid: str = "a", connected: int = 1) -> ClientView:
    return ClientView(client_id=cid, version_held=None, connected=connected)


def test_every_name_has_a_class() -> None:
    assert sorted(STRATEGIES) == sorted(
        ["central-sync", "central-async", "decentral-sync", "decentral-async"]
    )


def test_shard_cursor_visits_every_shard_each_cycle() -> None:
    c = ShardCursor(5, np.random.default_rng(1))
    for _ in range(3):
        assert sorted(c.next() for _ in range(5)) == list(range(5))
    first = c.next()
    c.requeue(first)
    assert c.next() == first


@settings(max_examples=200, deadline=None)
@given(
    shards=st.integers(1, 12),
    prefs=st.lists(st.lists(st.integers(0, 11), max_size=4), min_size=1, max_size=60),
)
def test_shard_cursor_with_preferences_still_visits_every_shard_once_a_cycle(
    shards: int, prefs: list[list[int]]
) -> None:
    """Affinity reorders a cycle, never skips or repeats a shard within one; a
    preferred shard still due is the one given."""
    c = ShardCursor(shards, np.random.default_rng(0))
    given_out: list[int] = []
    for p in prefs:
        due = set(c._queue) if c._queue else set(range(shards))
        wanted = [s for s in p if s in due]
        got = c.next(tuple(p))
        assert got == wanted[0] if wanted else got in due
        given_out.append(got)
    full = len(given_out) // shards * shards
    for i in range(0, full, shards):
        assert sorted(given_out[i : i + shards]) == list(range(shards))


@settings(max_examples=200, deadline=None)
@given(
    shards=st.integers(1, 8),
    lead=st.integers(1, 5),
    prefs=st.lists(st.lists(st.integers(0, 7), max_size=3), min_size=1, max_size=80),
)
def test_shard_cursor_with_a_lead_keeps_every_shard_within_lead_visits(
    shards: int, lead: int, prefs: list[list[int]]
) -> None:
    """A lead lets a preference come from cycles ahead, but never lets one shard
    run more than ``lead`` visits ahead of another; a preference
    within reach is the one given."""
    c = ShardCursor(shards, np.random.default_rng(0))
    counts = [0] * shards
    for p in prefs:
        reachable = any(s < shards and counts[s] - min(counts) < lead for s in p)
        got = c.next(tuple(p), lead)
        assert got in p if reachable else got not in p
        counts[got] += 1
        assert max(counts) - min(counts) <= lead


def test_more_clients_than_shards_each_keep_the_shard_they_hold() -> None:
    """12 slow-link clients on 3 shards, each holding one, ask in turn: with a
    lead of the crowd over the shards (4 cycles) every one is given its own
    shard; one cycle gave 27 of the 60 requests theirs, and the rest a shard to
    fetch."""
    s, _ = build("decentral-async", tau=2)
    shards = s.cursor.shards
    holds = {f"c{i}": i // 4 for i in range(12)}  # a shard's four holders in a row
    given = []
    for _ in range(5):
        for cid, shard in holds.items():
            me = ClientView(client_id=cid, version_held=0, connected=12, held=(shard,))
            given.append((shard, s.task_for(me, 0).shard))
    assert all(mine == got for mine, got in given)
    one_cycle = ShardCursor(shards, np.random.default_rng(0))
    kept = sum(one_cycle.next((mine,)) == mine for mine, _ in given)
    assert kept <= len(given) // 2


def test_a_client_is_given_a_shard_it_holds_when_one_is_due() -> None:
    s, _ = build("decentral-async", tau=2)
    first = s.task_for(view("a"), 0).shard
    held = ClientView(client_id="b", version_held=None, connected=2, held=(first,))
    other = s.task_for(held, 0).shard  # its shard was given this cycle: a new one
    assert other != first
    # next cycle, "a" gets its shard back before any other
    s.task_for(view("c"), 0)  # the cycle's last shard (3 shards)
    again = ClientView(client_id="a", version_held=None, connected=2, held=(first,))
    assert s.task_for(again, 0).shard == first


def test_central_async_scales_by_staleness() -> None:
    s, model = build("central-async", lr=0.5, staleness={"kind": "polynomial", "a": 1.0})
    book = LeaseBook()
    t0 = book.new_task(s.task_for(view(), 0), version=0, now=0)
    t1 = book.new_task(s.task_for(view("b"), 0), version=0, now=0)
    assert t0.kind == "gradient" and t0.steps == 1 and t0.batch == 4
    g = np.ones(SPEC.num_params, np.float32)
    before = model.params.data.copy()
    assert s.on_result(t0, g, 1).staleness == 0
    out = s.on_result(t1, g, 2)  # one version stale: half the step
    assert out.accepted and out.staleness == 1 and model.version == 2
    np.testing.assert_allclose(model.params.data, before - 0.5 * g - 0.25 * g, rtol=1e-6)


def test_decentral_sync_round_averages_and_state_roundtrips() -> None:
    s, model = build("decentral-sync", clients_per_round=2, tau=3)
    book = LeaseBook()
    tasks = []
    for cid in "ab":
        plan = s.task_for(view(cid, 2), 0)
        assert plan is not None and plan.kind == "local" and plan.steps == 3
        task = book.new_task(plan, version=0, now=0)
        s.on_task_created(task)
        tasks.append(task)
    assert s.task_for(view("c", 3), 0) is None  # both slots planned: wait
    before = model.params.data.copy()
    assert s.on_result(tasks[0], np.full(SPEC.num_params, 1.0, np.float32), 1).step is None
    state = s.state_dict()
    clone, _ = build("decentral-sync", clients_per_round=2, tau=3)
    clone.load_state_dict(state)
    assert clone.pending() == 1
    rep = s.on_result(tasks[1], np.full(SPEC.num_params, 3.0, np.float32), 2).step
    assert rep is not None and rep.merged == 2 and model.version == 1
    np.testing.assert_allclose(model.params.data, before + 2.0)
    # a task of a closed round is stale
    assert s.on_result(tasks[1], np.zeros(SPEC.num_params, np.float32), 3).reason == "stale"


@pytest.mark.parametrize("name", ["decentral-sync", "central-sync"])
def test_a_round_takes_in_clients_that_connect_before_its_first_result(name: str) -> None:
    # Players arrive one by one: the first opens the round alone. Those who join
    # before any result are given slots of the same round (and version); once a
    # result is in, a newcomer waits for the next round; a fixed clients_per_round
    # never grows.
    s, _ = build(name)
    book = LeaseBook()
    tasks = []
    for n, cid in enumerate("abc", start=1):
        plan = s.task_for(view(cid, n), 0)
        assert plan is not None and plan.round == 1
        tasks.append(book.new_task(plan, version=0, now=0))
        s.on_task_created(tasks[-1])
    assert s.task_for(view("c", 3), 0) is None  # nobody new: no slot
    assert s.on_result(tasks[0], np.zeros(SPEC.num_params, np.float32), 1).step is None
    assert s.task_for(view("d", 4), 1) is None  # a result is in: the next round
    assert s.on_result(tasks[1], np.zeros(SPEC.num_params, np.float32), 2).step is None
    rep = s.on_result(tasks[2], np.zeros(SPEC.num_params, np.float32), 3).step
    assert rep is not None and rep.merged == 3  # the round waited for all three
    fixed, _ = build(name, clients_per_round=1)
    assert fixed.task_for(view("a", 1), 0) is not None
    assert fixed.task_for(view("b", 2), 0) is None


def test_round_lease_lost_reissues_to_another_client() -> None:
    s, _ = build("central-sync", clients_per_round=1)
    book = LeaseBook()
    task = book.new_task(s.task_for(view("a"), 0), version=0, now=0)
    s.on_task_created(task)
    book.lease(task, "a", now=0, deadline=1)
    assert s.on_lease_lost(task, 1.0)
    assert s.task_for(view("a"), 1.0) is None  # not back to the client that lost it
    plan = s.task_for(view("b"), 1.0)
    assert plan is not None and plan.reissue == task.task_id and plan.seed == task.seed
    book.resolve_task(task, TaskState.DROPPED, 2.0)


@pytest.mark.parametrize(("grace", "closes_at"), [(None, 30.0), (0.5, 18.0), (0.0, 12.0)])
def test_a_quorum_grace_closes_a_round_soon_after_its_quorum(grace, closes_at) -> None:
    """Four slots, quorum 0.75: the third result comes in 12 s after the round
    opened, so with grace 0.5 the round closes at 12 + 6 s instead of its 30-s
    deadline, and the fourth task is dropped."""
    s, model = build("decentral-sync", clients_per_round=4, quorum=0.75, quorum_grace=grace, tau=2)
    book = LeaseBook()
    tasks = []
    for cid in "abcd":
        task = book.new_task(s.task_for(view(cid, 4), 0.0), version=0, now=0.0)
        s.on_task_created(task)
        tasks.append(task)
    d = np.full(SPEC.num_params, 0.01, np.float32)
    for task, at in zip(tasks[:3], (10.0, 11.0, 12.0), strict=True):
        assert s.on_result(task, d, at).step is None
    assert s.next_deadline() == closes_at
    assert s.on_tick(closes_at - 0.5) is None
    report = s.on_tick(closes_at)
    assert report is not None and report.merged == 3 and model.version == 1
    assert report.dropped == (tasks[3].task_id,)


@pytest.mark.parametrize("agg", ["fedasync", "fedbuff"])
def test_decentral_async_rejects_too_stale(agg: str) -> None:
    s, model = build("decentral-async", max_staleness=1, aggregation=agg, buffer_k=1)
    book = LeaseBook()
    old = book.new_task(s.task_for(view(), 0), version=0, now=0)
    model.version = 2
    out = s.on_result(old, np.zeros(SPEC.num_params, np.float32), 1)
    assert not out.accepted and out.reason == "stale" and out.staleness == 2


@pytest.mark.parametrize(
    ("name", "cfg", "sign"),
    [
        ("decentral-sync", {"clients_per_round": 2}, 1.0),
        ("central-sync", {"clients_per_round": 2, "lr": 1.0}, -1.0),
        ("decentral-async", {"aggregation": "fedbuff", "buffer_k": 2}, 1.0),
    ],
)
def test_a_mean_weights_each_result_by_its_tasks_rows(name: str, cfg: dict, sign: float) -> None:
    """FedAvg: unequal shards of 30 and 10 rows sending 1 and 3 average to
    (30·1 + 10·3) / 40 = 1.5, not 2; the weights survive a checkpoint."""
    s, model = build(name, **cfg)
    book = LeaseBook()
    tasks = []
    for cid, rows in (("a", 30), ("b", 10)):
        task = book.new_task(s.task_for(view(cid, 2), 0), version=0, now=0, rows=rows)
        s.on_task_created(task)
        tasks.append(task)
    before = model.params.data.copy()
    assert s.on_result(tasks[0], np.full(SPEC.num_params, 1.0, np.float32), 1).step is None
    clone, cmodel = build(name, **cfg)
    clone.load_state_dict(s.state_dict())
    for strat, m in ((s, model), (clone, cmodel)):
        rep = strat.on_result(tasks[1], np.full(SPEC.num_params, 3.0, np.float32), 2).step
        assert rep is not None and rep.merged == 2
        np.testing.assert_allclose(m.params.data, before + sign * 1.5, rtol=1e-6)


def test_a_task_without_rows_counts_one() -> None:
    s, _ = build("decentral-sync")
    task = LeaseBook().new_task(s.task_for(view(), 0), version=0, now=0)
    assert task.rows is None and s.sample_weight(task) == 1.0


@pytest.mark.parametrize(
    ("name", "cfg"),
    [
        ("central-async", {"lr": 0.5}),
        ("central-sync", {"clients_per_round": 1, "lr": 0.5}),
        ("decentral-sync", {"clients_per_round": 1}),
        ("decentral-sync", {"clients_per_round": 1, "outer_optimizer": "nesterov"}),
        ("decentral-async", {"window": 1}),
        ("decentral-async", {"window": 4}),
        ("decentral-async", {"aggregation": "fedbuff", "buffer_k": 1}),
    ],
)
def test_the_schedule_scales_every_server_step(name: str, cfg: dict) -> None:
    """strategy.schedule multiplies the step at each version: 0.25 at version 0,
    0.625 at version 1 (a warm-up from 0.25 to 1 over 2 versions), against the
    same results without a schedule."""
    ramp = {"kind": "warmup-cosine", "start": 0.25, "peak": 1.0, "end": 1.0}
    plain, pmodel = build(name, staleness={"kind": "constant"}, **cfg)
    sched, smodel = build(
        name, staleness={"kind": "constant"}, schedule={**ramp, "warmup": 2, "versions": 2}, **cfg
    )
    g = np.linspace(-1, 1, SPEC.num_params).astype(np.float32)
    for version, factor in ((0, 0.25), (1, 0.625)):
        moved = []
        for s, model in ((plain, pmodel), (sched, smodel)):
            book = LeaseBook()
            task = book.new_task(s.task_for(view(), 0), version=version, now=0)
            s.on_task_created(task)
            before = model.params.data.copy()
            out = s.on_result(task, g, 1)
            assert out.accepted and out.step is not None and model.version == version + 1
            moved.append(model.params.data - before)
        np.testing.assert_allclose(moved[1], factor * moved[0], rtol=1e-5, atol=1e-7)
        assert np.abs(moved[0]).max() > 0
        smodel.params.data[:] = pmodel.params.data  # the next step from the same point


def _sync_round(s, book: LeaseBook, deltas: list[np.ndarray]):
    tasks = []
    for i, _ in enumerate(deltas):
        plan = s.task_for(view(f"c{i}", len(deltas)), 0)
        task = book.new_task(plan, version=s.model.version, now=0)
        s.on_task_created(task)
        tasks.append(task)
    reports = [s.on_result(t, d, 1) for t, d in zip(tasks, deltas, strict=True)]
    assert reports[-1].step is not None
    return reports[-1].step


def test_an_auto_outer_lr_sizes_each_round_by_its_signal_and_survives_a_checkpoint() -> None:
    """Two results that agree step Nesterov at the peak (0.95 of the edge); two
    that cancel leave the next agreeing round at a fraction of it; the running
    estimate round-trips through the strategy's state."""
    cfg = dict(clients_per_round=2, outer_optimizer="nesterov", outer_momentum=0.9)
    s, model = build("decentral-sync", outer_lr="auto", **cfg)
    book = LeaseBook()
    d = np.full(SPEC.num_params, 0.01, np.float32)
    before = model.params.data.copy()
    assert s.round_outer_lr() is None  # no round has chosen one yet
    _sync_round(s, book, [d, d])
    peak = 0.95 * nesterov_edge(0.9)
    assert s.last_outer_lr == pytest.approx(peak)
    # Nesterov's first step from rest: lr (1 + momentum) times the direction
    np.testing.assert_allclose(model.params.data - before, peak * 1.9 * d, rtol=1e-4)
    _sync_round(s, book, [d + 1.0, d - 1.0])
    _sync_round(s, book, [d, d])
    assert s.last_outer_lr < peak / 4
    clone, _ = build("decentral-sync", outer_lr="auto", **cfg)
    clone.load_state_dict(s.state_dict())
    assert clone.auto_outer.state_dict() == s.auto_outer.state_dict()
    fixed, _ = build("decentral-sync", outer_lr=0.7, **cfg)
    assert fixed.auto_outer is None and fixed.round_outer_lr() == 0.7


def test_a_rounds_coverage_is_the_expected_share_of_rows_its_tasks_sampled() -> None:
    """Shard 0 sampled twice, half its rows each (1 - 0.5² = 0.75 of it), shard 1
    once (0.5), shard 2 not at all: (0.75 + 0.5) / 3 of the job's rows; a task
    whose rows are unknown counts for nothing."""
    s, _ = build("decentral-sync", clients_per_round=4, tau=5)
    book = LeaseBook()
    tasks = [book.new_task(s.task_for(view(c, 4), 0), version=0, now=0) for c in "abcd"]
    for t, (shard, rows) in zip(tasks, [(0, 40), (0, 40), (1, 40), (2, None)], strict=True):
        t.shard, t.rows = shard, rows
    assert tasks[0].steps * tasks[0].batch == 20
    assert s.coverage(tasks) == pytest.approx((0.75 + 0.5) / 3)
    assert s.coverage(tasks[3:]) == 0.0


def test_diloco_steps_each_arrival_at_its_share_of_a_round() -> None:
    """Two tasks in flight from version 0: with outer SGD at lr 1 the first moves
    the model by 1/K of its delta; the concurrency K follows staleness + 1 and
    round-trips through a checkpoint."""
    s, model = build("decentral-async", aggregation="diloco", window=1)
    book = LeaseBook()
    t0 = book.new_task(s.task_for(view(), 0), version=0, now=0)
    t1 = book.new_task(s.task_for(view("b", 2), 0), version=0, now=0)
    d = np.ones(SPEC.num_params, np.float32)
    before = model.params.data.copy()
    assert s.on_result(t0, d, 1).accepted
    k = s.concurrency
    assert k == 1.0  # staleness 0: one in flight as far as it can tell
    np.testing.assert_allclose(model.params.data, before + d, rtol=1e-6)
    s.on_result(t1, d, 2)  # one version stale: two were in flight
    assert 1.0 < s.concurrency < 2.0
    np.testing.assert_allclose(model.params.data, before + d + d / s.concurrency, rtol=1e-5)
    state = s.state_dict()
    again, _ = build("decentral-async", aggregation="diloco", window=1)
    again.load_state_dict(state)
    assert again.concurrency == s.concurrency


def test_diloco_with_nesterov_moves_k_arrivals_as_far_as_one_round() -> None:
    """Eight tasks in flight, each 7 versions stale on arrival (K = 8): 20 rounds
    of the same delta move the model within 10 % of 20 synchronous Nesterov
    rounds of it. Momentum once summed whole deltas per arrival, so K arrivals
    moved it about K times as far as a round (7x here)."""
    k = 8
    s, model = build(
        "decentral-async",
        aggregation="diloco",
        window=1,
        outer_optimizer="nesterov",
        outer_lr=0.7,
        outer_momentum=0.9,
    )
    s.concurrency = float(k)
    book = LeaseBook()
    d = np.full(SPEC.num_params, 1e-3, np.float32)
    before = model.params.data.copy()
    for _ in range(20 * k):
        version = max(0, model.version - (k - 1))
        task = book.new_task(s.task_for(view("a", k), 0), version=version, now=0)
        assert s.on_result(task, d, 1).accepted
    assert s.concurrency == pytest.approx(k, rel=0.05)
    rounds = OuterOptimizer(kind="nesterov", lr=0.7, momentum=0.9)
    sync = before.copy()
    for _ in range(20):
        rounds.step(sync, d)
    np.testing.assert_allclose(model.params.data - before, sync - before, rtol=0.1)


def test_the_default_merge_weighs_a_result_by_one_over_one_plus_staleness() -> None:
    s, model = build("decentral-async", window=1)
    book = LeaseBook()
    tasks = [book.new_task(s.task_for(view(c, 3), 0), version=0, now=0) for c in "abc"]
    d = np.ones(SPEC.num_params, np.float32)
    before = model.params.data.copy()
    for i, t in enumerate(tasks):
        assert s.on_result(t, d, i + 1).staleness == i
    np.testing.assert_allclose(model.params.data, before + d * (1 + 1 / 2 + 1 / 3), rtol=1e-6)
