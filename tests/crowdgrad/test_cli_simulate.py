"""``crowdgrad simulate`` and ``crowdgrad plan`` end to end through ``main``."""

import json

import pytest

from crowdgrad.cli import main


def test_simulate_smoke_writes_its_report(tmp_path, capsys):
    out = tmp_path / "smoke"
    assert main(["simulate", "smoke", "-o", str(out), "--no-plots", "--quiet"]) == 0
    for name in ("results.json", "timeseries.csv", "summary.md"):
        assert (out / name).stat().st_size > 0, name
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 1
    s = runs[0]["summary"]
    assert s["reason"] == "target_accuracy" and s["accuracy"] >= 0.85
    assert s["results_accepted"] > 0


def test_simulate_list_names_the_shipped_scenarios(capsys):
    assert main(["simulate", "--list"]) == 0
    out = capsys.readouterr().out
    assert {"smoke", "digits-time-to-target", "scale-700"} <= set(out.split())
    smoke = next(line for line in out.splitlines() if line.split()[:1] == ["smoke"])
    assert "Four players, digits, roblox links" in smoke
    assert "[--sweep: 9 runs]" in out  # digits-time-to-target's grid


def test_simulate_explains_its_columns_and_a_speedup_below_one():
    from types import SimpleNamespace

    from crowdgrad.commands.simulate import how_to_read

    fast, slow = (
        SimpleNamespace(summary={"speedup": 3.0}),
        SimpleNamespace(summary={"speedup": 0.4}),
    )
    assert "'virtual s' is simulated time" in how_to_read([fast])
    assert "below 1" not in how_to_read([fast])
    assert "A speedup below 1 means the players took longer than one machine" in how_to_read(
        [fast, slow]
    )


def test_simulate_without_output_dir_is_a_usage_error(capsys):
    assert main(["simulate", "smoke"]) == 2
    assert "-o" in capsys.readouterr().err


def test_plan_json_gives_linear_and_speedups(capsys):
    argv = ["plan", "--t-grad", "0.85", "--t-comm", "0.4", "--workers", "1,8", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["estimates"]
    linear = [r for r in rows if r["strategy"] == "linear"]
    assert {r["workers"] for r in rows} == {1, 8}
    # D = 100 steps at 0.85 s each on one machine
    assert linear[0]["seconds"] == pytest.approx(85.0) and linear[0]["speedup"] == 1.0
    da8 = next(r for r in rows if r["strategy"] == "decentral-async" and r["workers"] == 8)
    assert da8["speedup"] > 1.0


def test_plan_prefetch_hides_the_transfers(capsys):
    argv = ["plan", "--t-grad", "0.85", "--t-comm", "4", "--workers", "8", "--steps", "800"]
    assert main([*argv, "--json"]) == 0
    off = json.loads(capsys.readouterr().out)["estimates"]
    assert main([*argv, "--json", "--prefetch"]) == 0
    on = json.loads(capsys.readouterr().out)["estimates"]
    da = {r["prefetch"]: r for r in on + off if r["strategy"] == "decentral-async"}
    assert da[True]["contention"] == "independent"  # prefetch models a link per client
    # tau*t_grad = 8.5 s > t_comm: 2 transfers + 10 exchanges of 8.5 s
    assert da[True]["seconds"] == pytest.approx(2 * 4 + 10 * 8.5)
    assert da[True]["speedup"] > da[False]["speedup"]


def test_plan_table_prints(capsys):
    assert main(["plan", "--preset", "large", "--profile", "roblox", "--workers", "8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "decentral-async" in out and "0.00x" not in out
    assert "'linear' is one machine doing every mini-batch step itself" in out
    assert "Every speedup here is below 1: the crowd would finish later than one machine" in out
    assert "What raises it: more local steps per exchange (--tau" in out
    argv = ["plan", "--preset", "large", "--profile", "lan", "--tau", "50", "--steps", "1000"]
    assert main(argv) == 0
    assert "The crowd beats one machine" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["plan", "--workers", "x,2", "--t-grad", "1", "--t-comm", "1"], "--workers"),
        (["plan", "--t-grad", "1"], "--t-comm"),
        (["plan", "--preset", "large", "--widths", "4,2"], "--preset"),
        (
            ["plan", "--t-grad", "1", "--t-comm", "1", "--prefetch", "--contention", "shared"],
            "independent",
        ),
    ],
)
def test_plan_bad_arguments_exit_2_naming_them(argv, named, capsys):
    assert main(argv) == 2
    assert named in capsys.readouterr().err
