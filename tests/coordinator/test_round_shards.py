"""Which shard a sync round's task trains on, and how the round weighs shards.

A round with a slot for every shard keeps each holder on a shard it holds, gives
its last slots to shards nobody visited yet, and weighs each shard by its rows
however many tasks visited it (RoundStrategy._shard_for, shard_weights).
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.config import DataSection, StrategySection
from coordinator.core.leases import LeaseBook
from coordinator.core.strategies import ClientView, ModelState, make_strategy
from nn.spec import ModelSpec

SPEC = ModelSpec(widths=(3, 2))


def rounds(shards: int, **cfg):
    model = ModelState(params=SPEC.init_params(0))
    s = make_strategy(
        model=model,
        config=StrategySection(name="decentral-sync", **cfg),
        data=DataSection(shards=shards, batch=4),
        rng=np.random.default_rng(0),
    )
    return s, model


def one_round(s, book: LeaseBook, held: dict[str, tuple[int, ...]], order, deltas=None):
    """Every client asks once, in ``order``; each returns its delta (zeros, or
    ``deltas[shard]``). The shard each client got, by client."""
    got, tasks = {}, []
    for cid in order:
        me = ClientView(client_id=cid, version_held=None, connected=len(held), held=held[cid])
        plan = s.task_for(me, 0)
        assert plan is not None
        task = book.new_task(plan, version=s.model.version, now=0, rows=100)
        s.on_task_created(task)
        got[cid] = plan.shard
        tasks.append(task)
    zero = np.zeros(SPEC.num_params, np.float32)
    reports = [s.on_result(t, zero if deltas is None else deltas[t.shard], 1) for t in tasks]
    assert reports[-1].step is not None  # the round closed on its last result
    return got


def test_a_round_of_every_shard_keeps_each_holder_on_its_shard_however_unevenly_held() -> None:
    """9 clients on 4 shards, shard 0 held thrice and the others twice: no client
    is ever sent a shard to fetch, and every round visits every shard. The cursor's
    bound (no shard 3 visits ahead) gave shard 0's holders other shards from the
    fourth round on: with 700 roblox players, a round stalled 16 s on the fetches
    every dozen rounds."""
    s, _ = rounds(4)
    held = {f"c{i}": ((0,) if i < 3 else ((i - 1) // 2,)) for i in range(9)}
    book, rng = LeaseBook(), np.random.default_rng(1)
    for _ in range(30):
        order = list(rng.permutation(sorted(held)))
        got = one_round(s, book, held, order)
        assert all(got[c] == held[c][0] for c in held)
        assert set(got.values()) == {0, 1, 2, 3}


def test_a_rounds_last_slots_go_to_the_shards_it_has_not_visited() -> None:
    """5 clients who all hold shard 0 of 4: the first two train on it, the last
    three are given shards 1, 2 and 3 (fetched), so the round still sees every
    row; a client holding several trains on the one visited least."""
    s, _ = rounds(4)
    held = {f"c{i}": (0,) for i in range(5)}
    book = LeaseBook()
    for _ in range(3):
        got = one_round(s, book, held, sorted(held))
        assert [got[f"c{i}"] for i in range(2)] == [0, 0]
        assert sorted(got[f"c{i}"] for i in range(2, 5)) == [1, 2, 3]
    held = {"a": (0, 1), "b": (0, 1), "c": (2,), "d": (3,), "e": (0, 1)}
    got = one_round(s, book, held, ["a", "b", "c", "d", "e"])
    assert got == {"a": 0, "b": 1, "c": 2, "d": 3, "e": 0}


def test_a_small_round_keeps_the_cursors_cycles() -> None:
    """2 clients on 4 shards: a round cannot visit every shard, so the cursor's
    cycle decides and a holder is sent its shard only while it is due."""
    s, _ = rounds(4)
    held = {"a": (0,), "b": (0,)}
    book = LeaseBook()
    seen = []
    for _ in range(2):
        got = one_round(s, book, held, ["a", "b"])
        assert got["a"] != got["b"]  # one cycle never gives shard 0 twice
        seen += got.values()
    assert sorted(seen) == [0, 1, 2, 3]


def test_a_round_weighs_each_shard_by_its_rows_however_many_tasks_visited_it() -> None:
    """Three tasks on shard 0 and one on shard 1, with equal rows: plain averaging
    (outer sgd, lr 1) moves the model by the mean of the two shards' deltas, not
    three quarters of the way to shard 0's."""
    s, model = rounds(2, outer_optimizer="sgd", outer_lr=1.0)
    held = {"a": (0,), "b": (0,), "c": (0,), "d": (1,)}
    a = np.full(SPEC.num_params, 1.0, np.float32)
    b = np.full(SPEC.num_params, -1.0, np.float32)
    before = model.params.data.copy()
    got = one_round(s, LeaseBook(), held, ["a", "b", "c", "d"], deltas={0: a, 1: b})
    assert sorted(got.values()) == [0, 0, 0, 1]
    np.testing.assert_allclose(model.params.data - before, (a + b) / 2, atol=1e-6)
    assert s.shard_weights([]) == []


@settings(max_examples=60, deadline=None)
@given(
    shards=st.integers(1, 8),
    crowds=st.lists(
        st.lists(st.lists(st.integers(0, 7), max_size=3), min_size=1, max_size=20),
        min_size=1,
        max_size=6,
    ),
)
def test_every_round_visits_every_shard_whoever_holds_what(
    shards: int, crowds: list[list[list[int]]]
) -> None:
    """Any holdings (nothing, several shards, ids the job no longer has), any
    order: a round of at least as many clients as shards visits every shard; only
    its last slots (one a shard) send a holder elsewhere, and none does where each
    client holds one shard and every shard has a holder."""
    s, _ = rounds(shards)
    book = LeaseBook()
    for crowd in crowds:
        crowd = crowd + [[]] * max(0, shards - len(crowd))
        held = {f"c{i:02d}": tuple(h) for i, h in enumerate(crowd)}
        got = one_round(s, book, held, sorted(held))
        assert set(got.values()) == set(range(shards))
        valid = {c: [h for h in held[c] if h < shards] for c in held}
        strays = [c for c in held if valid[c] and got[c] not in valid[c]]
        assert len(strays) <= shards
        single = all(len(set(v)) <= 1 for v in valid.values())
        if single and {h for v in valid.values() for h in v} == set(range(shards)):
            assert strays == []
