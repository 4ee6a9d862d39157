"""A coordinator core built from its job: every part made once, in a fixed order.

``build_core`` is the one way to make a ``Coordinator``; the same job, params and
seed give the same parts and random streams (the strategy's, the codecs', the
replicas', the sub-models'), so the same calls give bitwise the same model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coordinator.core import checkpoint
from coordinator.core.config import JobConfig
from coordinator.core.connections import Connections
from coordinator.core.credit import CreditBook
from coordinator.core.data import DataCatalog, load_job_data
from coordinator.core.downloads import ModelDistribution
from coordinator.core.evaluation import Evaluator
from coordinator.core.handshake import server_limits
from coordinator.core.issuing import TaskIssuer
from coordinator.core.layersplit import BOUNDARY, LOWER, UPPER, Boundaries, SplitBlocks
from coordinator.core.leases import LeaseBook
from coordinator.core.linkcodecs import delta_versions
from coordinator.core.machine import Coordinator
from coordinator.core.orphans import Orphans
from coordinator.core.reference import job_reference_norms, split_reference_norms
from coordinator.core.refusals import RefusalMarks
from coordinator.core.registry import Registry
from coordinator.core.replication import Replicator
from coordinator.core.results import ResultPath
from coordinator.core.strategies import ModelState, make_strategy, serves_prefetch
from coordinator.core.submodel import SubmodelPlanner
from coordinator.core.taskwriter import TaskWriter
from coordinator.core.validation import UpdateValidator
from nn.data import Dataset
from nn.params import Params
from protocol.checksum import crc32


def build_core(
    job: JobConfig,
    params: Params | None = None,
    seed: int = 0,
    *,
    dataset: Dataset | None = None,
    teacher: Params | None = None,
    share_params: bool = False,
    session_key: bytes | None = None,
) -> Coordinator:
    """``params`` defaults to the spec's seeded init. ``share_params``: train
    ``params`` itself rather than a copy (a model in a mapped file, nn/mapped.py,
    too big to hold twice). ``session_key``: a secret that makes resume tokens
    unguessable (a served coordinator draws one per process, registry.py); None:
    seeded, for simulations."""
    spec = job.spec
    # Version 0 is the init seed's exactly when no params were given: then a
    # client that says so in hello builds it itself instead of downloading it.
    seeded = params is None
    if params is None:
        params, share_params = spec.init_params(job.model.init_seed), True
    if params.spec.widths != spec.widths:
        raise ValueError(
            f"params: widths {list(params.spec.widths)} differ from the job's {list(spec.widths)}"
        )
    model = ModelState(params=params if share_params else params.copy())
    v0_crc = crc32(model.params.data) if seeded else None
    root = np.random.SeedSequence(seed)
    # spawn(n)'s first children are spawn(n-1)'s: the other streams are unchanged
    strat_seq, codec_seq, replica_seq, submodel_seq = root.spawn(4)
    codec_rng = np.random.default_rng(codec_seq)
    submodels = (
        SubmodelPlanner(
            job.submodel,
            spec,
            model_codec=job.codecs.model,
            update_codec=job.codecs.update,
            rng=np.random.default_rng(submodel_seq),
        )
        if job.submodel.enabled
        else None
    )
    connections = Connections()
    # Outcomes of resolved tasks are kept long enough to answer a late copy of a
    # result (a client resending after a reconnect) as duplicate, not stale.
    book = LeaseBook(
        on_release=connections.released,
        retain_s=max(600.0, 2 * job.lease.resume_grace_s),
    )
    registry = Registry(
        seed,
        max_left=job.lease.max_resumable,
        max_left_unproven=job.lease.max_resumable_unproven,
        key=session_key,
    )
    validator = UpdateValidator(job.validation, size=spec.num_params)
    dataset = dataset or load_job_data(job)
    data = DataCatalog.for_job(job, dataset)
    split: SplitBlocks | None = None
    block_validators: dict[int, UpdateValidator] = {}
    strat_rng = np.random.default_rng(strat_seq)
    if job.split.enabled:
        split = SplitBlocks(spec, job.split.cut, init_seed=job.model.init_seed)
        classes = dataset.num_classes or 0
        boundaries = Boundaries(job.split, data, dataset.y_train, classes=classes)
        block_validators = {
            b: UpdateValidator(job.validation, size=split.spec_of(b).num_params)
            for b in (LOWER, UPPER)
        }
        # a lower result's boundary: its size is its shard's rows × the cut's width
        block_validators[BOUNDARY] = UpdateValidator(job.validation, size=0)
    strategy = make_strategy(
        model=model,
        config=job.strategy,
        data=job.data,
        rng=strat_rng,
        split=None if split is None else (split, boundaries),
    )
    tasks = TaskWriter(job, spec, dataset, data, teacher=teacher)
    evaluator = Evaluator(dataset, job.eval)
    if split is None:
        validator.reference = job_reference_norms(
            job,
            model.params,
            dataset,
            data.indices,
            local=strategy.task_kind == "local",
            optimizer=tasks.optimizer,
            seed=seed,
            seq=submodel_seq,
        )
    else:
        norms = split_reference_norms(
            job, split, model.params, dataset, data.indices, optimizer=tasks.optimizer, seed=seed
        )
        for block, reference in norms.items():
            block_validators[block].reference = reference
    limits = server_limits(job)
    verifier = Replicator(
        job.replication,
        model=model,
        book=book,
        registry=registry,
        rng=np.random.default_rng(replica_seq),
        describe=tasks.describe,
        dataset=dataset,
        # one result is one additive step: it can be subtracted again
        journal=job.strategy.name == "central-async" or job.strategy.aggregation == "fedasync",
    )
    downloads = ModelDistribution(
        spec=spec,
        codecs=job.codecs,
        max_message_bytes=limits.max_message_bytes,
        model=lambda: (model.version, model.params),
        snapshot=verifier.snapshot,
        rng=codec_rng,
        delta_rng=np.random.default_rng(codec_seq.spawn(1)[0]),
        delta_versions=delta_versions(job),
    )
    orphans = Orphans(
        book,
        registry,
        strategy,
        verifier,
        grace_s=job.lease.resume_grace_s,
        cap=2 * job.lease.max_resumable,
    )
    refusal_marks = RefusalMarks()
    credit = CreditBook(verified_only=job.replication.enabled)
    flops_per_sample = spec.flops_per_sample()
    results = ResultPath(
        job=job,
        model=model,
        book=book,
        strategy=strategy,
        validator=validator,
        verifier=verifier,
        conns=connections,
        orphans=orphans,
        flops_per_sample=flops_per_sample,
        block_validators=block_validators,
        marks=refusal_marks,
        credit=credit,
    )
    issuer = TaskIssuer(
        job=job,
        spec=spec,
        model=model,
        book=book,
        data=data,
        strategy=strategy,
        submodels=submodels,
        split=split,
        verifier=verifier,
        orphans=orphans,
        downloads=downloads,
        tasks=tasks,
        connections=connections,
        flops_per_sample=flops_per_sample,
        v0_crc=v0_crc,
    )
    return Coordinator(
        job=job,
        spec=spec,
        seed=seed,
        model=model,
        v0_crc=v0_crc,
        codec_rng=codec_rng,
        submodels=submodels,
        connections=connections,
        book=book,
        registry=registry,
        validator=validator,
        dataset=dataset,
        data=data,
        split=split,
        block_validators=block_validators,
        strategy=strategy,
        tasks=tasks,
        evaluator=evaluator,
        limits=limits,
        downloads=downloads,
        verifier=verifier,
        orphans=orphans,
        refusal_marks=refusal_marks,
        results=results,
        issuer=issuer,
        credit=credit,
        flops_per_sample=flops_per_sample,
        reference_seq=submodel_seq,
        prefetch=serves_prefetch(job),
    )


def restore_core(
    job: JobConfig,
    state: dict[str, Any],
    seed: int = 0,
    *,
    dataset: Dataset | None = None,
    teacher: Params | None = None,
    params: Params | None = None,
    session_key: bytes | None = None,
) -> Coordinator:
    """A core resumed from ``state_dict()``; clients reconnect with resume ids
    unknown to it, so they start fresh records, and old task ids are never reused.
    ``params``: the restored model already in place (a mapped one), trained as it
    is; ``state["params"]`` is then not read."""
    core = build_core(
        job,
        checkpoint.params_of(job.spec, state) if params is None else params,
        seed,
        dataset=dataset,
        teacher=teacher,
        share_params=params is not None,
        session_key=session_key,
    )
    checkpoint.load_state(core, state)
    return core
