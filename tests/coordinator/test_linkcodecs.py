"""Codecs per connection (coordinator/core/linkcodecs.py): a client whose link sets
its task's length gets int8 models and int4-sr updates and deltas, everyone else
the job's codecs; its result is checked against the codec its own task named."""

from __future__ import annotations

import pytest

from compression import CodecId
from coordinator.core.config import JobConfigError, parse_job
from coordinator.core.linkcodecs import (
    AUTO_DELTA_BYTES,
    CROWD_MIN,
    SlowCodecs,
    choose,
    delta_versions,
    link_bound,
    sends_deltas,
    slow_codecs,
)
from coordinator.core.submodel import encoded_bytes
from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.limits import LinkLimits, profile
from tests.coordinator.coord_helpers import (
    acks,
    deliver,
    hello,
    make_core,
    make_job,
    result_messages,
    sent,
    task_of,
)

SLOW = {int(CodecId.INT8), int(CodecId.INT4), int(CodecId.FP32)}
CROWD = SLOW | {int(CodecId.INT2)}
INT8 = {int(CodecId.INT8), int(CodecId.FP32)}
FP32_ONLY = {int(CodecId.FP32)}


def test_a_slow_link_gets_int8_models_and_int4_updates_and_a_fast_one_the_jobs() -> None:
    """Deltas too, in int4 (test_a_slow_link_gets_int4_deltas_without_a_delta_codec)."""
    job = make_job(strategy={"tau": "auto"})
    spec = job.spec
    slow = choose(job, spec, profile("roblox"), SLOW)
    assert (slow.model, slow.update, slow.delta) == ("int8", "int4-sr", "int4-sr")
    assert slow.model_bytes == encoded_bytes(spec, "int8") < spec.nbytes / 3
    assert slow.update_bytes == encoded_bytes(spec, "int4-sr") < spec.nbytes / 6
    fast = choose(job, spec, profile("lan"), SLOW)
    assert (fast.model, fast.update, fast.delta) == ("fp32", "fp32", None)
    assert fast.round_trip_bytes == 2 * spec.nbytes


def test_a_job_with_deltas_sends_a_slow_client_int4_deltas() -> None:
    job = make_job(codecs={"delta": "fp32"})
    assert choose(job, job.spec, profile("roblox"), SLOW).delta == "int4-sr"
    assert choose(job, job.spec, profile("lan"), SLOW).delta == "fp32"


def test_each_direction_falls_back_to_the_slow_model_codec_then_the_jobs() -> None:
    """A client that lists int8 but not int4 moves int8 every way (deltas too);
    one that lists neither keeps the job's codecs."""
    job = make_job(codecs={"delta": "fp32"})
    int8 = choose(job, job.spec, profile("roblox"), INT8)
    assert (int8.model, int8.update, int8.delta) == ("int8", "int8", "int8")
    own = choose(job, job.spec, profile("roblox"), FP32_ONLY)
    assert (own.model, own.update, own.delta) == ("fp32", "fp32", "fp32")


def test_the_link_is_slow_when_its_round_trip_outlasts_the_task_it_asks_for() -> None:
    job = make_job(strategy={"task_seconds": 1.0, "transfer_ratio": 5.0})

    def at(bytes_per_s: float) -> bool:
        return link_bound(
            job,
            1_000_000,
            LinkLimits(bytes_per_s=bytes_per_s, messages_per_s=100, max_message_bytes=1 << 20),
        )

    assert not at(5_000_000)  # 5 x 0.2 s = the task's 1 s: the compute sets it
    assert at(4_000_000)  # 5 x 0.25 s > 1 s: the link does


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({}, SlowCodecs("int8", "int4-sr", "int4-sr", crowd="int2-sr")),
        ({"codecs": {"slow_link": "off"}}, None),
        ({"codecs": {"slow_link": "fp16"}}, SlowCodecs("fp16", "fp16", "fp16")),
        ({"codecs": {"update": "int8"}}, None),  # the operator chose its codecs
        ({"codecs": {"delta": "int8"}}, None),
        ({"replication": {"enabled": True}}, None),  # twins compare exact uploads
        ({"submodel": {"mode": "ist"}}, None),  # slices are sized in the job's codecs
    ],
)
def test_auto_is_int8_and_int4_only_where_the_job_keeps_its_exact_default_codecs(
    sections: dict, expected: SlowCodecs | None
) -> None:
    assert slow_codecs(make_job(**sections)) == expected


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"codecs": {"slow_link": "int9"}}, "slow_link"),
        ({"codecs": {"slow_link": "int8"}, "replication": {"enabled": True}}, "slow_link"),
        ({"codecs": {"slow_link": "int8"}, "submodel": {"mode": "ist"}}, "slow_link"),
    ],
)
def test_a_slow_link_codec_the_job_cannot_use_is_refused_by_name(
    sections: dict, message: str
) -> None:
    data = {"model": {"widths": [64, 16, 10]}, "data": {"dataset": "digits"}, **sections}
    with pytest.raises(JobConfigError, match=message):
        parse_job(data)


def test_a_slow_clients_task_comes_in_int8_and_goes_in_int4() -> None:
    """On roblox links a client listing int8 and int4 gets its model's chunks in int8
    and its task's upload codec int4-sr, its result in int4 is merged; one that
    lists fp32 only keeps fp32; a chunk in another codec than its task named is
    refused."""
    core = make_core(strategy={"tau": "auto"}, link={"profile": "roblox"})
    out = core.connect("a", hello("a", codecs=("fp32", "int8", "int4")), 0.0)
    task = task_of(out, "a")
    assert task.upload_codec == "int4-sr"
    assert {c.codec for c in sent(out, "a", m.Chunk)} == {int(CodecId.INT8)}
    v = core.model.version
    got = deliver(core, "a", result_messages(task, codec="int4-sr"), 1.0)
    assert acks(got, "a") == [(task.task_id, True, "")]
    assert core.model.version == v + 1

    out = core.connect("b", hello("b"), 2.0)
    plain = task_of(out, "b")
    assert plain.upload_codec == "fp32"
    assert {c.codec for c in sent(out, "b", m.Chunk)} == {int(CodecId.FP32)}

    nxt = task_of(got, "a")
    got = deliver(core, "a", result_messages(nxt, codec="fp32")[:2], 3.0)  # its first chunk
    errors = sent(got, "a", m.Error)
    assert errors and errors[0].code == ErrorCode.BAD_CHUNK
    assert "asked for 'int4-sr'" in errors[0].message


def test_a_slow_task_is_sized_by_its_int8_transfer() -> None:
    """The auto-sized task of a slow client counts its transfer in int8: about a
    quarter of the bytes, so as many fewer steps where the link sets its length."""
    sizing = {"tau": "auto", "tau_max": 10**6, "max_epochs": 10**4, "task_seconds": 0.01}
    job = make_job(strategy=sizing)
    codecs = ("fp32", "int8")

    def steps(**sections: dict) -> tuple[int, str]:
        core = make_core(strategy=sizing, link={"profile": "roblox"}, **sections)
        task = task_of(core.connect("a", hello("a", codecs=codecs), 0.0), "a")
        return task.steps, task.upload_codec

    (int8, c8), (fp32, c32) = steps(), steps(codecs={"slow_link": "off"})
    assert (c8, c32) == ("int8", "fp32")
    ratio = job.spec.nbytes / encoded_bytes(job.spec, "int8")  # 3.66: a scale per row
    assert fp32 / int8 == pytest.approx(ratio, rel=0.02)


def test_a_slow_link_gets_int4_deltas_without_a_delta_codec() -> None:
    """Under auto a slow volunteer that holds a version the core keeps gets the next
    as an int4 delta, in rounds (where it always holds the version the next round
    starts from) and asynchronously alike. A fast link, and a job with
    ``slow_link`` off or its own codecs, keep full models unless the job names a
    delta codec."""
    sync = make_job("decentral-sync")
    assert sends_deltas(sync) and sends_deltas(make_job())
    assert not sends_deltas(make_job("decentral-sync", codecs={"slow_link": "off"}))
    assert not sends_deltas(make_job(codecs={"update": "int8"}))
    assert choose(sync, sync.spec, profile("roblox"), SLOW).delta == "int4-sr"
    assert choose(sync, sync.spec, profile("lan"), SLOW).delta is None

    core = make_core("decentral-sync", link={"profile": "roblox"})
    out = core.connect("a", hello("a", deltas=True, codecs=("fp32", "int8", "int4")), 0.0)
    task = task_of(out, "a")
    assert task.delta_base is None and task.upload_codec == "int4-sr"
    got = deliver(core, "a", result_messages(task, codec="int4-sr"), 1.0)
    assert acks(got, "a") == [(task.task_id, True, "")]
    nxt = task_of(got, "a")
    assert (nxt.model_version, nxt.delta_base) == (1, 0)
    chunks = [c for c in sent(got, "a", m.Chunk) if c.transfer == nxt.model_transfer]
    assert chunks and {c.codec for c in chunks} == {int(CodecId.INT4)}


def test_auto_deltas_keep_as_many_versions_as_fit_their_budget() -> None:
    """``auto``'s deltas keep at most AUTO_DELTA_BYTES of versions, none where two do
    not fit; a delta codec the job names keeps its ``delta_versions``, whatever the
    model."""
    assert delta_versions(make_job("decentral-sync")) == delta_versions(make_job()) == 16
    big = {"widths": [64, 4096, 4096, 10]}  # 67 MB as fp32: three fit in 256 MB
    job = make_job("decentral-sync", model=big)
    assert delta_versions(job) == AUTO_DELTA_BYTES // job.spec.nbytes == 3
    huge = {"widths": [64, 8192, 8192, 10]}  # 270 MB: not even one
    assert delta_versions(make_job("decentral-sync", model=huge)) == 0
    named = make_job("decentral-sync", model=huge, codecs={"delta": "fp32", "delta_versions": 2})
    assert delta_versions(named) == 2


def test_a_round_of_at_least_crowd_min_results_asks_a_slow_client_for_int2() -> None:
    """int2-sr's rounding variance is about 45x int4-sr's per value, and a round's mean
    divides it by the results it averages: a round that may close with CROWD_MIN
    results or more asks a slow client that lists int2 for int2-sr (and merges it),
    a smaller one, a robust aggregator's, an asynchronous job or a client without int2
    for int4-sr."""
    job = make_job("decentral-sync")
    slow = choose(job, job.spec, profile("roblox"), CROWD)
    assert slow.crowd == "int2-sr"
    assert slow.update_for(CROWD_MIN) == ("int2-sr", encoded_bytes(job.spec, "int2-sr"))
    assert slow.update_for(CROWD_MIN - 1) == ("int4-sr", slow.update_bytes)
    assert slow.crowd_bytes < slow.update_bytes * 0.6  # a scale a row: 0.51 on big models
    assert choose(job, job.spec, profile("roblox"), SLOW).crowd is None
    assert choose(job, job.spec, profile("lan"), CROWD).crowd is None

    def codec(name: str = "decentral-sync", codecs=("fp32", "int8", "int4", "int2"), **st):
        core = make_core(name, strategy=st, link={"profile": "roblox"})
        return core, task_of(core.connect("a", hello("a", codecs=codecs), 0.0), "a")

    core, task = codec(clients_per_round=CROWD_MIN, quorum=1.0)
    assert task.upload_codec == "int2-sr"
    v = core.model.version
    got = deliver(core, "a", result_messages(task, codec="int2-sr"), 1.0)
    assert acks(got, "a") == [(task.task_id, True, "")]
    assert core.strategy.pending() == 1 and core.model.version == v  # in the round
    assert codec(clients_per_round=CROWD_MIN - 1, quorum=1.0)[1].upload_codec == "int4-sr"
    # a round that may close with 3/4 of its target (the default quorum)
    assert codec(clients_per_round=CROWD_MIN)[1].upload_codec == "int4-sr"
    assert codec(clients_per_round=700)[1].upload_codec == "int2-sr"
    no_int2 = ("fp32", "int8", "int4")
    assert codec(clients_per_round=700, codecs=no_int2)[1].upload_codec == "int4-sr"
    assert codec("decentral-async")[1].upload_codec == "int4-sr"
    # a median keeps the rounding of one result, not the mean of many
    assert codec(clients_per_round=700, aggregator="median")[1].upload_codec == "int4-sr"
