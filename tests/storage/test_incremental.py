"""Incremental checkpoints: a ParamsPatch writes the changed neuron groups only,
refers to the stored ones for the rest, and every version reads back exactly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nn.params import Params
from nn.spec import ModelSpec
from storage import (
    Checkpoint,
    CheckpointStore,
    CorruptCheckpoint,
    NoCheckpoint,
    ParamsPatch,
    RetentionPolicy,
    StorageError,
    StoreLimits,
)

SPEC = ModelSpec(widths=(6, 40, 30, 4))
LIMITS = StoreLimits(max_chunk_bytes=512)  # 128 values: a few rows per group


def _store(path: Path) -> CheckpointStore:
    return CheckpointStore.open(path, limits=LIMITS, synchronous="NORMAL")


def _change(params: Params, plan, indices, rng: np.random.Generator) -> None:
    """Move the rows of the given groups (and nothing else)."""
    for i in indices:
        ws, bs = params.group_slices(plan[i])
        params.data[ws] += rng.standard_normal(ws.stop - ws.start).astype(np.float32)
        params.data[bs] += np.float32(1.0)


def _rows(db: Path, table: str) -> int:
    with sqlite3.connect(db) as c:
        return c.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_a_patch_writes_only_what_changed_and_reads_back_whole(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    live = SPEC.init_params(1)
    with _store(tmp_path / "s.db") as store:
        plan = store.param_groups(SPEC)
        assert len(plan) > 8
        full = store.save(Checkpoint(version=1, created_at=0.0, params=live, strategy={"n": 1}))
        assert full.base is None
        _change(live, plan, [0, 5], rng)
        patch = ParamsPatch.of(live, plan, [0, 5], base=1)
        info = store.save(Checkpoint(version=2, created_at=1.0, params=patch, strategy={"n": 2}))
        assert info.base == 1 and info.n_chunks == full.n_chunks
        want = sum(4 * (plan[i].rows * (SPEC.layer_shapes[plan[i].layer][1] + 1)) for i in (0, 5))
        assert info.nbytes == want < full.nbytes / 4
        back = store.load(2)
        assert back.params.array_equal(live) and back.strategy["n"] == 2
        assert store.write_cost(Checkpoint(version=3, created_at=2.0, params=patch)) == 3


def test_a_chain_survives_pruning_and_the_last_delete_frees_everything(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    live = SPEC.init_params(2)
    db = tmp_path / "s.db"
    with _store(db) as store:
        plan = store.param_groups(SPEC)
        store.save(Checkpoint(version=1, created_at=0.0, params=live))
        for v in range(2, 6):
            changed = rng.choice(len(plan), size=2, replace=False).tolist()
            _change(live, plan, changed, rng)
            store.save(
                Checkpoint(
                    version=v, created_at=v, params=ParamsPatch.of(live, plan, changed, v - 1)
                )
            )
            store.prune(RetentionPolicy(keep_last=2))
        assert store.versions() == [4, 5]
        assert store.load(5).params.array_equal(live)
        # What stays is at most one chunk per group plus what v4 and v5 wrote.
        assert _rows(db, "chunks") <= len(plan) + 4 + 2  # + the strategy/optimizer chunks
        store.delete(4)
        assert store.load(5).params.array_equal(live)
        store.delete(5)
        assert _rows(db, "chunks") == 0 and _rows(db, "chunk_refs") == 0


def test_damage_to_a_shared_chunk_fails_every_version_that_reads_it(tmp_path: Path) -> None:
    live = SPEC.init_params(3)
    db = tmp_path / "s.db"
    with _store(db) as store:
        plan = store.param_groups(SPEC)
        store.save(Checkpoint(version=1, created_at=0.0, params=live))
        _change(live, plan, [1], np.random.default_rng(2))
        store.save(Checkpoint(version=2, created_at=1.0, params=ParamsPatch.of(live, plan, [1], 1)))
    with sqlite3.connect(db) as c:  # flip a byte of v1's chunk 3, which v2 inherits
        (data,) = c.execute("SELECT data FROM chunks WHERE version=1 AND idx=3").fetchone()
        bad = bytes([data[0] ^ 0xFF]) + bytes(data[1:])
        c.execute("UPDATE chunks SET data=? WHERE version=1 AND idx=3", (bad,))
    with _store(db) as store:
        for v in (1, 2):
            with pytest.raises(CorruptCheckpoint, match="chunk 3"):
                store.load(v)
        assert [r.ok for r in store.verify()] == [False, False]


def test_bad_patches_are_refused_with_what_was_wrong(tmp_path: Path) -> None:
    live = SPEC.init_params(4)
    with _store(tmp_path / "s.db") as store:
        plan = store.param_groups(SPEC)
        with pytest.raises(NoCheckpoint, match="base v1 is not stored"):
            store.save(
                Checkpoint(version=2, created_at=0.0, params=ParamsPatch.of(live, plan, [0], 1))
            )
        store.save(Checkpoint(version=1, created_at=0.0, params=live))
        short = ParamsPatch(spec=SPEC, base=1, groups={0: np.zeros(3, np.float32)})
        with pytest.raises(ValueError, match="group 0 holds 3 values"):
            store.save(Checkpoint(version=2, created_at=0.0, params=short))
        beyond = ParamsPatch(spec=SPEC, base=1, groups={len(plan): np.zeros(3, np.float32)})
        with pytest.raises(ValueError, match=f"no neuron group {len(plan)}"):
            store.save(Checkpoint(version=2, created_at=0.0, params=beyond))
        other = ModelSpec(widths=(6, 40, 31, 4))
        with pytest.raises(ValueError, match="another model"):
            store.save(
                Checkpoint(
                    version=2,
                    created_at=0.0,
                    params=ParamsPatch.of(other.init_params(0), store.param_groups(other), [0], 1),
                )
            )
        with pytest.raises(ValueError, match="1-D float32"):
            ParamsPatch(spec=SPEC, base=1, groups={0: np.zeros(3)})
        assert store.versions() == [1]


def test_a_schema_1_store_is_read_and_upgraded(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    live = SPEC.init_params(5)
    with _store(db) as store:
        store.save(Checkpoint(version=1, created_at=0.0, params=live))
    with sqlite3.connect(db) as c:  # what a store written before schema 2 looks like
        c.execute("DROP TABLE chunk_refs")
        c.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    with CheckpointStore.open(db, readonly=True) as store:
        assert store.load(1).params.array_equal(live)
    with _store(db) as store:
        plan = store.param_groups(SPEC)
        _change(live, plan, [2], np.random.default_rng(3))
        store.save(Checkpoint(version=2, created_at=1.0, params=ParamsPatch.of(live, plan, [2], 1)))
        assert store.load(2).params.array_equal(live)
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("2",)
        c.execute("UPDATE meta SET value='9' WHERE key='schema_version'")
    with pytest.raises(StorageError, match="schema version 9"):
        _store(db)


def test_load_into_fills_the_given_params(tmp_path: Path) -> None:
    live = SPEC.init_params(6)
    with _store(tmp_path / "s.db") as store:
        store.save(Checkpoint(version=1, created_at=0.0, params=live))
        target = Params(SPEC)
        back = store.load_latest(into=target)
        assert back.params is target and target.array_equal(live)
        with pytest.raises(ValueError, match="widths"):
            store.load(1, into=Params(ModelSpec(widths=(6, 40, 4))))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["full", "patch", "patch", "prune", "delete-oldest"]),
            st.sets(st.integers(0, 30), max_size=6),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_any_history_of_saves_and_deletes_reads_back_exactly(tmp_path_factory, steps) -> None:
    """Property: whatever mix of full saves, patches on the newest version, prunes
    and deletes, every stored version loads as the model was when it was saved,
    and nothing is left once every version is deleted."""
    db = tmp_path_factory.mktemp("prop") / "s.db"
    rng = np.random.default_rng(7)
    live = SPEC.init_params(7)
    saved: dict[int, np.ndarray] = {}
    with _store(db) as store:
        plan = store.param_groups(SPEC)
        version = 0
        for op, groups in steps:
            changed = sorted(g for g in groups if g < len(plan))
            _change(live, plan, changed, rng)
            newest = max(saved, default=None)
            if op == "full" or (op == "patch" and newest is None):
                version += 1
                store.save(Checkpoint(version=version, created_at=0.0, params=live))
                saved[version] = live.data.copy()
            elif op == "patch":
                # A patch holds every group changed since the newest stored version.
                since = [i for i, g in enumerate(plan) if _differs(live, saved[newest], g)]
                version += 1
                patch = ParamsPatch.of(live, plan, since, newest)
                store.save(Checkpoint(version=version, created_at=0.0, params=patch))
                saved[version] = live.data.copy()
            elif op == "prune":
                for v in store.prune(RetentionPolicy(keep_last=2)):
                    del saved[v]
            elif saved:
                oldest = min(saved)
                store.delete(oldest)
                del saved[oldest]
            for v, data in saved.items():
                assert np.array_equal(store.load(v).params.data, data), (v, steps)
        for v in list(saved):
            store.delete(v)
    assert _rows(db, "chunks") == 0 and _rows(db, "chunk_refs") == 0


def _differs(params: Params, before: np.ndarray, g) -> bool:
    ws, bs = params.group_slices(g)
    return not (
        np.array_equal(params.data[ws], before[ws]) and np.array_equal(params.data[bs], before[bs])
    )


def test_a_live_save_copies_each_group_as_of_one_version_while_the_model_moves(
    tmp_path: Path,
) -> None:
    """A fuzzy checkpoint (LiveParams): another thread adds 1 to whole groups
    under the lock, one version each, and takes a turn (one to three steps)
    before every group's copy; every stored group equals the model at the
    ``as_of`` recorded for it, and a patch on it inherits those."""
    import threading

    from storage import LiveParams

    rng = np.random.default_rng(4)
    live = SPEC.init_params(9)
    live.data[:] = np.arange(live.data.size) % 1000  # integers: every sum is exact
    start = live.data.copy()
    lock, state = threading.Lock(), {"version": 0}
    with _store(tmp_path / "s.db") as store:
        plan = store.param_groups(SPEC)
        history: list[tuple[int, int]] = []  # (version, group) of each step
        # Turns handed over explicitly, so the interleaving is the same on every
        # run: the saver asks for a turn before each copy and waits until the
        # trainer has stepped; no scheduling decides how far the model moved.
        turn, stepped, stop = threading.Semaphore(0), threading.Semaphore(0), threading.Event()

        def train() -> None:
            while True:
                turn.acquire()
                if stop.is_set():
                    return
                for _ in range(int(rng.integers(1, 4))):
                    g = int(rng.integers(len(plan)))
                    with lock:
                        ws, bs = live.group_slices(plan[g])
                        live.data[ws] += 1.0
                        live.data[bs] += 1.0
                        state["version"] += 1
                        history.append((state["version"], g))
                stepped.release()

        class Turns:  # the model moves by a turn before each group's copy
            copies = 0

            def __enter__(self) -> None:
                turn.release()
                assert stepped.acquire(timeout=30), "the trainer did not take its turn"
                lock.acquire()
                Turns.copies += 1

            def __exit__(self, *exc: object) -> None:
                lock.release()

        t = threading.Thread(target=train)
        t.start()
        try:
            params = LiveParams(params=live, lock=Turns(), version=lambda: state["version"])
            store.save(Checkpoint(version=0, created_at=0.0, params=params))
        finally:
            stop.set()
            turn.release()
            t.join()
        back = store.load(0)
        # The model moved before every copy: each group was copied at a version of
        # its own, and the last one after every step.
        assert Turns.copies == len(plan) > 3
        assert len(set(back.as_of)) == len(plan)
        assert max(back.as_of) == state["version"] == len(history)
        for i, g in enumerate(plan):
            steps = sum(1 for v, h in history if h == i and v <= back.as_of[i])
            for span in live.group_slices(g):
                np.testing.assert_array_equal(back.params.data[span], start[span] + steps)
        # A patch on it keeps the inherited groups' as_of.
        patch = ParamsPatch.of(live, plan, [0], base=0)
        store.save(Checkpoint(version=1, created_at=0.0, params=patch))
        again = store.load(1)
        assert again.as_of[1:] == back.as_of[1:] and again.as_of[0] == 1
