import numpy as np
import pytest

from client.compute import dataset_ref, load_ref, run_task
from nn.data import load_dataset, shard
from nn.rng import Xoshiro128ss
from nn.spec import ModelSpec
from nn.train import compute_gradient, evaluate
from protocol import messages as m

SPEC = ModelSpec(widths=(64, 16, 10))


def make_task(kind: str, seed: int = 5) -> m.Task:
    data = load_ref(dataset_ref("digits", 0))
    idx = shard(data.y_train, 4, seed=0)[1].astype(np.int32)
    return m.Task(
        task_id="1",
        kind=kind,
        model_version=0,
        spec=SPEC,
        dataset=dataset_ref("digits", 0),
        indices=idx,
        steps=3,
        batch=8,
        optimizer={"kind": "sgd", "lr": 0.1, "momentum": 0.9},
        seed=seed,
        base_version=0,
    )


def test_dataset_ref_loads_the_same_split() -> None:
    ref = dataset_ref("digits", 3)
    assert np.array_equal(load_ref(ref).X_test, load_dataset("digits", seed=3).X_test)


@pytest.mark.parametrize("kind", ["train", "gradient"])
def test_run_task_is_deterministic_and_leaves_base_alone(kind: str) -> None:
    base = SPEC.init_params(0)
    snapshot = base.data.copy()
    a = run_task(make_task(kind), base)
    b = run_task(make_task(kind), base)
    assert np.array_equal(base.data, snapshot)
    assert a.update.dtype == np.float32 and a.update.shape == (SPEC.num_params,)
    assert np.array_equal(a.update, b.update) and np.isfinite(a.update).all()
    assert np.abs(a.update).max() > 0
    c = run_task(make_task(kind, seed=6), base)
    assert not np.array_equal(a.update, c.update)
    assert a.samples == 24  # steps x batch for both kinds


def test_bad_indices_and_kind() -> None:
    task = make_task("train")
    bad = m.Task(
        **{**{f: getattr(task, f) for f in task.SCHEMA}, "indices": np.array([10**6], np.int32)}
    )
    with pytest.raises(ValueError, match="out of range"):
        run_task(bad, SPEC.init_params(0))


def test_evaluate_reports_loss_and_accuracy_on_all_rows_and_no_update() -> None:
    task = make_task("train")
    ev = m.Task(**{**{f: getattr(task, f) for f in task.SCHEMA}, "kind": "evaluate"})
    base = SPEC.init_params(0)
    out = run_task(ev, base)
    data = load_ref(ev.dataset)
    want = evaluate(base, data.X_train[ev.indices], data.y_train[ev.indices])
    assert out.update.size == 0 and out.steps == 0 and out.samples == ev.indices.size
    assert out.loss == want.loss and out.metrics == {"accuracy": want.accuracy}


def test_batches_come_from_the_portable_generator() -> None:
    """Stream 0 of task.seed picks the rows (docs/protocol.md §12.2), not NumPy."""
    task = make_task("gradient")
    base = SPEC.init_params(0)
    data = load_ref(task.dataset)
    X, y = data.X_train[task.indices], data.y_train[task.indices]
    rows = Xoshiro128ss(task.seed, 0).permutation(X.shape[0])[: task.steps * task.batch]
    loss, grad = compute_gradient(base, X[rows], y[rows])
    out = run_task(task, base)
    assert out.loss == loss and np.array_equal(out.update, grad.data)
