import dataclasses

import numpy as np
import pytest

from client.compute import SlicedTask, dataset_ref, load_ref, run_task
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


def _steps_task(steps: int, opt: dict) -> m.Task:
    task = make_task("train")
    fields = {f: getattr(task, f) for f in task.SCHEMA}
    return m.Task(**{**fields, "steps": steps, "optimizer": opt})


@pytest.mark.parametrize("cuts", [[1] * 7, [3, 3, 1], [2, 100]])
@pytest.mark.parametrize(
    "opt", [{"kind": "sgd", "lr": 0.1, "momentum": 0.9}, {"kind": "adam", "lr": 0.01}]
)
def test_a_sliced_task_is_run_task_bit_for_bit(cuts: list[int], opt: dict) -> None:
    """However a train task is cut (the frame budget cuts it per step), its update
    is the whole task's: the batches are drawn up front as run_task draws them."""
    task = _steps_task(7, opt)
    base = SPEC.init_params(0)
    snapshot = base.data.copy()
    whole = run_task(task, base)
    sliced = SlicedTask(task, base)
    ran = [sliced.run(n) for n in cuts]
    assert sum(ran) == 7 and sliced.finished and sliced.run(5) == 0
    out = sliced.output()
    np.testing.assert_array_equal(out.update, whole.update)
    assert (out.steps, out.samples) == (whole.steps, whole.samples)
    assert out.loss == pytest.approx(whole.loss, rel=1e-6)
    np.testing.assert_array_equal(base.data, snapshot)


def test_a_sliced_task_refuses_its_output_before_the_end() -> None:
    sliced = SlicedTask(_steps_task(4, {"kind": "sgd", "lr": 0.1}), SPEC.init_params(0))
    sliced.run(3)
    with pytest.raises(ValueError, match="3 of 4 pieces"):
        sliced.output()


@pytest.mark.parametrize("kind", ["gradient", "evaluate"])
def test_gradient_and_evaluate_are_one_piece(kind: str) -> None:
    task = make_task(kind)
    base = SPEC.init_params(0)
    sliced = SlicedTask(task, base)
    assert sliced.steps == 1 and sliced.run(10) == 1 and sliced.finished
    whole = run_task(task, base)
    np.testing.assert_array_equal(sliced.output().update, whole.update)
    assert sliced.output().metrics == whole.metrics


def test_a_boundary_task_returns_its_rows_activations_under_the_trained_block() -> None:
    """§3.3.2: every row the task names, in order, at hidden layer ``boundary``,
    after the task's steps; the sliced run returns the same bits."""
    from nn.layersplit import boundary_of
    from nn.params import Params

    task = dataclasses.replace(make_task("train"), boundary=1)
    base = SPEC.init_params(3)
    out = run_task(task, base)
    assert out.boundary is not None and out.boundary.shape == (task.indices.size, 16)
    trained = Params(SPEC, base.data + out.update)
    X = load_ref(task.dataset).X_train[task.indices]
    assert np.allclose(out.boundary, boundary_of(trained, 1, X), atol=1e-5)
    sliced = SlicedTask(task, base)
    while not sliced.finished:
        sliced.run(1)
    assert np.array_equal(sliced.output().boundary, out.boundary)
    assert run_task(make_task("train"), base).boundary is None
