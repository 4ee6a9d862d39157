import csv
import json

import pytest

from simulations.report import RunResult, Sample, seed_figure, summary_markdown, write_report
from simulations.scenario import expand_sweep, load_raw, parse_scenario, resolve


def seed_points(name):
    return expand_sweep(load_raw(resolve(name)), source=name)


def test_seed_figures_are_matched_to_their_experiments():
    by_point = {
        (p["job.model.preset"], p["job.strategy.name"]): seed_figure(sc.to_dict())
        for p, sc in seed_points("seed-table-4.4-4.6")
    }
    assert by_point[("large", "decentral-async")] == 13.901
    assert by_point[("tiny", "central-sync")] == 0.995
    lat = {
        (p["job.model.preset"], p["clients.latency"]): seed_figure(sc.to_dict())
        for p, sc in seed_points("seed-table-4.7")
    }
    assert lat[("medium", 0.3)] == 0.798
    assert lat[("large", 0.0)] == 13.901
    big = {
        p["job.model.preset"]: seed_figure(sc.to_dict()) for p, sc in seed_points("seed-table-4.8")
    }
    assert big == {"huge": 66.838, "extreme": 26143.993}


def test_no_seed_figure_for_other_setups():
    sc = parse_scenario({"clients": {"count": 64}, "run": {"max_steps": 100}})
    assert seed_figure(sc.to_dict()) is None


def make_runs():
    runs = []
    for i, (point, sc) in enumerate(seed_points("seed-table-4.4-4.6")[:2]):
        series = [
            Sample(
                t=0.1 * k,
                version=k,
                steps=10 * k,
                loss=None if k == 0 else 1.0 / k,
                accuracy=None,
                bytes_up=100 * k,
                bytes_down=200 * k,
                clients_online=8,
            )
            for k in range(5)
        ]
        summary = {
            "mode": "numeric",
            "reason": "max_steps",
            "virtual_seconds": 0.4 + i,
            "steps": 100,
            "versions": 4,
            "accuracy": None,
            "linear_seconds": 1.0,
            "speedup": 1.0 / (0.4 + i),
            "bytes_per_client": 1234.0,
            "time_to_target": float("inf"),
        }
        runs.append(
            RunResult(
                label=f"run{i}", point=point, scenario=sc.to_dict(), summary=summary, series=series
            )
        )
    return runs


def test_write_report_files(tmp_path):
    out = write_report(make_runs(), tmp_path / "out")
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "accuracy.png",
        "bytes.png",
        "clients.png",
        "results.json",
        "summary.md",
        "timeseries.csv",
    ]
    doc = json.loads((out / "results.json").read_text())
    assert [r["label"] for r in doc["runs"]] == ["run0", "run1"]
    assert doc["runs"][0]["summary"]["time_to_target"] is None  # inf is not JSON
    assert doc["runs"][0]["seed_seconds"] == 0.995
    rows = list(csv.DictReader((out / "timeseries.csv").open()))
    assert len(rows) == 10
    assert rows[0]["loss"] == "" and rows[1]["loss"] == "1.0"
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "summary.md").read_text()
    assert "| run0 |" in md and "0.995" in md and "GFLOP/s" in md


def test_report_is_byte_identical_when_rewritten(tmp_path):
    a = write_report(make_runs(), tmp_path / "a")
    b = write_report(make_runs(), tmp_path / "b")
    for name in ("results.json", "timeseries.csv", "summary.md", "bytes.png"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_summary_mentions_cost_mode():
    runs = make_runs()
    runs[0].summary["mode"] = "cost"
    assert "cost model only" in summary_markdown(runs)


def test_empty_report_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no runs"):
        write_report([], tmp_path)
