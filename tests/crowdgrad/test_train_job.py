"""``crowdgrad train --job``: the one-machine anchor of a job (crowdgrad/anchor.py)."""

from __future__ import annotations

import json

import pytest

from coordinator.core.config import parse_job
from crowdgrad.anchor import AnchorRun, Plateau, Point, grid_of, job_optimizer, train_for
from crowdgrad.cli import main
from nn.data import load_dataset


def test_the_anchor_trains_the_jobs_model_on_its_data_and_records_its_curve(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("[model]\nwidths = [64, 16, 10]\n[eval]\nmax_samples = 200\n")
    out = tmp_path / "anchor.json"
    argv = ["--threads", "1", "train", "--job", str(job), "--seconds", "0.6"]
    assert main([*argv, "--eval-every", "0.2", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    best = d["best"]
    assert best["batch"] == 16 and best["threads"] == 1 and d["thread_rates"].keys() == {"1"}
    assert best["optimizer"]["kind"] == "sgd" and best["optimizer"]["lr"] == 0.05  # the job's
    ts = [p["t"] for p in best["history"]]
    assert len(ts) >= 2 and ts == sorted(ts) and ts[-1] >= 0.6
    steps = [p["steps"] for p in best["history"]]
    assert steps == sorted(steps) and steps[0] > 0
    assert best["best_accuracy"] > 0.5  # digits learns in well under a second
    assert d["trials"] == []
    # the job's own schedule, as its crowd trains: reduce-on-plateau by default
    assert best["plateau"] == {"patience": 10, "factor": 0.5, "minimum": 0.125}
    assert [f["plateau"] for f in d["finals"]] == [best["plateau"]]


def test_the_grid_tries_every_setting_and_trains_the_best(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("[model]\nwidths = [64, 16, 10]\n[eval]\nmax_samples = 200\n")
    out = tmp_path / "anchor.json"
    argv = ["--threads", "1", "train", "--job", str(job), "--seconds", "0.3", "--grid"]
    assert main([*argv, "--grid-seconds", "0.1", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    base = job_optimizer(parse_job({}))
    assert len(d["trials"]) == len(grid_of(base))
    top = max(d["trials"], key=lambda t: t["best_accuracy"] or 0.0)
    assert top["best_accuracy"] == max(t["best_accuracy"] for t in d["trials"])
    assert d["best"]["optimizer"]["kind"] in ("sgd", "momentum", "adam")
    # the chosen setting for the budget with the job's schedule and at a constant lr,
    # the one that ended higher kept
    finals = d["finals"]
    assert [f["plateau"] is None for f in finals] == [False, True]
    kept = max(finals, key=lambda f: f["settled_accuracy"])
    assert d["best"]["plateau"] == kept["plateau"]


def test_the_plateau_schedule_cuts_the_lr_down_to_its_floor():
    """A model that stops improving within a second: the lr is halved each time
    the held-out loss goes ``patience`` evaluations without a new best, twice at
    most (a floor of a quarter)."""
    from nn.optim import Optimizer

    ds = load_dataset("digits")
    job = parse_job({"model": {"widths": [64, 16, 10]}})
    kw = dict(seconds=1.5, batch=16, seed=0, eval_every_s=0.02, max_eval_rows=100)
    opt = Optimizer(kind="sgd", lr=0.5)
    cut = train_for(job.spec, ds, opt, plateau=Plateau(2, 0.5, 0.25), **kw)
    assert 1 <= len(cut.cuts) <= 2 and cut.cuts == sorted(cut.cuts)
    flat = train_for(job.spec, ds, opt, **kw)
    assert flat.cuts == [] and flat.plateau is None
    # each cut came after 2 evaluations without a new best held-out loss
    losses = [(p.t, p.loss) for p in cut.history]
    for t in cut.cuts:
        i = next(k for k, (tk, _) in enumerate(losses) if tk == t)
        before = min((x for _, x in losses[: i - 1]), default=float("inf"))
        assert min(losses[i - 1][1], losses[i][1]) >= before


def test_the_jobs_plateau_schedule_and_none():
    assert Plateau.of(parse_job({})) == Plateau(10, 0.5, 0.125)
    assert Plateau.of(parse_job({"strategy": {"plateau_patience": 0}})) is None


def test_the_grid_brackets_the_jobs_lr_without_repeats():
    base = job_optimizer(parse_job({"strategy": {"lr": 0.2}}))
    grid = grid_of(base)
    assert grid[0] == base and len(set(grid)) == len(grid)
    sgd = sorted(o.lr for o in grid if o.kind == "sgd")
    assert sgd[0] == pytest.approx(0.05) and sgd[-1] == pytest.approx(0.8)
    assert {o.kind for o in grid} == {"sgd", "momentum", "adam"}


def test_an_anchor_run_answers_time_to_and_accuracy_at():
    run = AnchorRun(optimizer={}, threads=1, batch=16)
    run.history = [Point(t=0.5, steps=10, accuracy=0.5, loss=1.0),
                   Point(t=1.0, steps=20, accuracy=0.8, loss=0.5),
                   Point(t=1.5, steps=30, accuracy=0.7, loss=0.6)]  # fmt: skip
    assert run.time_to(0.75) == 1.0 and run.time_to(0.9) is None
    assert run.accuracy_at(1.2) == 0.8 and run.accuracy_at(0.1) is None
    assert (run.best_accuracy, run.final_accuracy, run.best_loss) == (0.8, 0.7, 0.5)


def test_a_diverging_setting_stops_early():
    ds = load_dataset("digits")
    job = parse_job({"model": {"widths": [64, 16, 10]}})
    from nn.optim import Optimizer

    run = train_for(job.spec, ds, Optimizer(kind="sgd", lr=1e6), seconds=30.0, batch=16,
                    seed=0, eval_every_s=0.05)  # fmt: skip
    assert run.history and run.history[-1].t < 30.0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--seconds", "0"], "--seconds"),
        (["--eval-every", "-1"], "--eval-every"),
        (["--grid-seconds", "0"], "--grid-seconds"),
        (["--widths", "64,10"], "--job takes the model"),
    ],
)
def test_bad_anchor_arguments_exit_2_naming_them(tmp_path, extra, needle, capsys):
    job = tmp_path / "job.toml"
    job.write_text("")
    assert main(["train", "--job", str(job), *extra]) == 2
    assert needle in capsys.readouterr().err


def test_a_bad_job_file_is_named(tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text("[strategy]\ntau = 0\n")
    assert main(["train", "--job", str(job)]) == 2
    assert "strategy.tau" in capsys.readouterr().err
