from pathlib import Path

import pytest

from coordinator.core.config import JobConfig, JobConfigError, load_job, parse_job

GOOD = """
name = "digits-dasync"

[model]
widths = [64, 128, 10]

[data]
dataset = "digits"
shards = 8
sharding = "label_skew"

[strategy]
name = "decentral-sync"
tau = 5
outer_optimizer = "nesterov"
outer_lr = 0.7

[strategy.staleness]
kind = "hinge"
b = 2

[link]
profile = "roblox"

[stop]
target_accuracy = 0.95
max_versions = 100

[checkpoint]
every_versions = 10
"""


def test_load_good_file(tmp_path: Path) -> None:
    p = tmp_path / "job.toml"
    p.write_text(GOOD)
    job = load_job(p)
    assert job.name == "digits-dasync"
    assert job.spec.widths == (64, 128, 10)
    assert job.data.sharding == "label_skew"
    assert job.strategy.name == "decentral-sync"
    assert job.strategy.staleness.kind == "hinge" and job.strategy.staleness.b == 2
    assert job.stop.max_versions == 100
    assert job.checkpoint.every_versions == 10
    assert job.lease.heartbeat_timeout_s > job.lease.heartbeat_interval_s


def test_defaults_are_a_working_decentral_async_job() -> None:
    job = JobConfig()
    assert job.strategy.name == "decentral-async"
    assert job.spec.widths == (64, 128, 10)


def test_preset_model() -> None:
    job = parse_job({"model": {"preset": "small"}})
    assert job.spec.num_params == 890


def test_every_bad_field_is_listed(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(
        """
[model]
widths = [64, 0, 10]

[data]
shards = 0
batch = -1

[strategy]
name = "gossip"
quorum = 1.5
typo_field = 3

[lease]
heartbeat_interval_s = 10
heartbeat_timeout_s = 5
"""
    )
    with pytest.raises(JobConfigError) as info:
        load_job(p)
    paths = {path for path, _ in info.value.errors}
    assert {
        "model",
        "data.shards",
        "data.batch",
        "strategy.name",
        "strategy.quorum",
        "strategy.typo_field",
        "lease",
    } <= paths
    text = str(info.value)
    assert str(p) in text and "width" in text and "heartbeat_timeout_s" in text


def test_model_needs_exactly_one_of_widths_or_preset() -> None:
    with pytest.raises(JobConfigError, match="exactly one"):
        parse_job({"model": {"widths": [4, 2], "preset": "tiny"}})


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "x.toml"
    p.write_text("[model\nwidths = 3")
    with pytest.raises(JobConfigError, match="<toml>"):
        load_job(p)
    with pytest.raises(JobConfigError, match="cannot read"):
        load_job(tmp_path / "missing.toml")


def test_replace_revalidates() -> None:
    job = JobConfig()
    assert job.replace(strategy={"tau": 3}).strategy.tau == 3
    with pytest.raises(JobConfigError, match=r"strategy\.tau"):
        job.replace(strategy={"tau": 0})


def test_the_extreme_example_job_is_valid_and_merges_in_place() -> None:
    """examples/extreme/job.toml: what `crowdgrad coordinator` maps and journals."""
    from pathlib import Path

    from coordinator.core.config import load_job
    from nn.mapped import MAP_ABOVE_PARAMS

    job = load_job(Path(__file__).parents[2] / "examples" / "extreme" / "job.toml")
    assert job.spec.num_params > MAP_ABOVE_PARAMS  # held in a mapped file
    assert job.submodel is not None and job.strategy.name == "decentral-async"
    assert job.strategy.aggregation == "fedasync" and job.strategy.window == 1  # journaled


def test_a_schedule_names_its_bad_phase() -> None:
    ramp = {"kind": "warmup-cosine", "start": 0.5, "peak": 2, "warmup": 50}
    with pytest.raises(JobConfigError) as info:
        parse_job({"strategy": {"schedule": {**ramp, "versions": 10}}})
    (path, message), *_ = info.value.errors
    assert path == "strategy.schedule" and "warmup (50)" in message
    with pytest.raises(JobConfigError) as info:
        parse_job({"strategy": {"schedule": {**ramp, "versions": 80, "peak": 0}}})
    assert [p for p, _ in info.value.errors] == ["strategy.schedule.peak"]
    job = parse_job({"strategy": {"schedule": {**ramp, "versions": 80}}})
    assert job.strategy.schedule.peak == 2.0
    assert parse_job({}).strategy.schedule.kind == "constant"


def test_relative_paths_in_a_job_file_are_relative_to_the_file(tmp_path: Path) -> None:
    """Issue 34: [data] path was taken from the file's folder, [distill] teacher
    from the working directory."""
    folder = tmp_path / "jobs"
    folder.mkdir()
    p = folder / "job.toml"
    p.write_text('[data]\npath = "rows.npz"\n\n[distill]\nteacher = "models/teacher.npz"\n')
    job = load_job(p)
    assert job.data.path == str(folder / "rows.npz")
    assert job.distill.teacher == str(folder / "models" / "teacher.npz")
    absolute = tmp_path / "elsewhere.npz"
    p.write_text(f'[distill]\nteacher = "{absolute}"\n')
    assert load_job(p).distill.teacher == str(absolute)


def test_prefetch_is_auto_true_or_false_and_anything_else_is_named() -> None:
    assert JobConfig().lease.prefetch == "auto"
    assert parse_job({"lease": {"prefetch": False}}).lease.prefetch is False
    with pytest.raises(JobConfigError, match=r"lease\.prefetch") as info:
        parse_job({"lease": {"prefetch": "sometimes"}})
    assert "auto" in str(info.value)


def test_an_auto_outer_lr_needs_rounds_and_a_number_must_be_positive() -> None:
    job = parse_job({"strategy": {"name": "decentral-sync", "outer_lr": "auto"}})
    assert job.strategy.outer_lr == "auto"
    assert parse_job({}).strategy.outer_lr == 1.0
    with pytest.raises(JobConfigError, match="decentral-sync") as info:
        parse_job({"strategy": {"aggregation": "diloco", "outer_lr": "auto"}})
    assert "decentral-async" in str(info.value)
    for bad in (0, -1.0, float("nan"), "sometimes"):
        with pytest.raises(JobConfigError, match=r"strategy\.outer_lr"):
            parse_job({"strategy": {"name": "decentral-sync", "outer_lr": bad}})


def test_a_quorum_grace_is_none_or_a_finite_share() -> None:
    assert parse_job({}).strategy.quorum_grace is None
    assert parse_job({"strategy": {"quorum_grace": 0.5}}).strategy.quorum_grace == 0.5
    for bad in (-0.1, float("inf"), "soon"):
        with pytest.raises(JobConfigError, match=r"strategy\.quorum_grace"):
            parse_job({"strategy": {"quorum_grace": bad}})
