"""What a task message says: a leased task as its client gets it, and as the
coordinator recomputes it to settle a replication dispute.

Every field comes from the checked job and the core's own counters, so messages
are built with ``m.Task.trusted`` (no per-field checks; tests/coordinator/test_core.py
holds it equal to the checked construction). Where the rows come from depends on
the client: one that fetches shards by hash (hello.data, docs/protocol.md §13)
is named the shard and trains on all of it; any other gets the shard's rows of
the named dataset's training split. A distillation job's task carries its rows'
teacher logits (docs/coordinator.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compression.distill import teacher_targets
from coordinator.core.config import JobConfig
from coordinator.core.data import DataCatalog
from coordinator.core.downloads import Download
from coordinator.core.leases import Task
from nn.data import Dataset
from nn.modelfile import load_model
from nn.params import Params
from nn.spec import INIT_SCHEME, ModelSpec
from protocol import messages as m


class TaskWriter:
    """Builds ``task`` messages for one job; ``teacher`` (or the job's
    ``distill.teacher`` file) makes it a distillation job."""

    __slots__ = (
        "_data",
        "_job",
        "_shard_idx",
        "_spec",
        "dataset_name",
        "optimizer",
        "teacher_logits",
    )

    def __init__(
        self,
        job: JobConfig,
        spec: ModelSpec,
        dataset: Dataset,
        data: DataCatalog,
        *,
        teacher: Params | None = None,
    ) -> None:
        self._job = job
        self._spec = spec
        self._data = data
        self._shard_idx = data.indices
        #: the same for every task
        self.dataset_name = f"{dataset.name[:100]}#{job.data.seed}"
        st = job.strategy
        self.optimizer: dict[str, Any] = {
            "kind": st.client_optimizer,
            "lr": float(st.lr),
            "momentum": float(st.momentum),
        }
        if teacher is None and job.distill.teacher is not None:
            teacher = load_model(job.distill.teacher)[0]
        #: distillation job: the teacher's logits per training row (float16), else None
        self.teacher_logits = (
            None if teacher is None else teacher_targets(teacher, spec, dataset.X_train)
        )

    def message(
        self,
        task: Task,
        dl: Download,
        *,
        deadline: float,
        shards: bool,
        seeded: bool,
        init_crc: int | None,
        part: ModelSpec | None = None,
        boundary: int | None = None,
        upload_codec: str | None = None,
    ) -> m.Task:
        """The task as leased: ``dl`` is how its model reaches the client,
        ``upload_codec`` the codec of its result (None: the job's),
        ``shards`` whether the client fetches shards by hash, ``seeded`` whether it
        builds version 0 itself from the init seed (``init_crc`` checks it).
        ``part``: a layer-split block's spec, ``boundary`` its cut (a lower block)."""
        send_model = dl.kind in ("full", "delta")
        sub = task.subnet
        if part is None:
            part = self._spec if sub is None else sub.sub
        return m.Task.trusted(
            task_id=str(task.task_id),
            kind=self.kind(task),
            model_version=dl.version,
            spec=part,
            dataset=self.dataset_name,
            shard=task.shard,
            indices=self.indices(task, shards=shards),
            steps=task.steps,
            batch=task.batch,
            optimizer=self.optimizer_of(task),
            seed=task.seed,
            deadline=deadline,
            base_version=dl.version if dl.kind == "none" else None,
            model_transfer=dl.transfer if send_model else None,
            num_chunks=len(dl.chunks),
            upload_codec=upload_codec or self._job.codecs.update,
            error_feedback=self._job.codecs.error_feedback,
            delta_base=dl.delta_base,
            init_seed=self._job.model.init_seed if seeded else None,
            init_crc=init_crc if seeded else None,
            data=self._data.shard(task.shard).sha256 if shards else None,
            init_scheme=INIT_SCHEME if seeded else None,
            subnet=None if sub is None else sub.to_wire(),
            boundary=boundary,
            **self.distill_fields(task),
        )

    def optimizer_of(self, task: Task) -> dict[str, Any]:
        """The job's client optimizer, at the task's own lr (strategy.lr_scaling)."""
        if task.lr_scale == 1.0:
            return self.optimizer
        return {**self.optimizer, "lr": self.optimizer["lr"] * task.lr_scale}

    def describe(self, task: Task) -> m.Task:
        """The task as a client without shards gets it, minus the model: what the
        coordinator runs itself to settle a replication dispute (replication.py)."""
        return m.Task.trusted(
            task_id=str(task.task_id),
            kind=self.kind(task),
            model_version=task.version,
            spec=self._spec,
            dataset=self.dataset_name,
            shard=task.shard,
            indices=self._shard_idx[task.shard],
            steps=task.steps,
            batch=task.batch,
            optimizer=self.optimizer_of(task),
            seed=task.seed,
            base_version=task.version,
            **self.distill_fields(task),
        )

    def indices(self, task: Task, *, shards: bool) -> np.ndarray | None:
        """Rows of the task's data: all of its shard for a client that fetches shards
        (explicit only for distill, whose teacher rows align with them), else the
        shard's rows of the named dataset's training split."""
        if not shards:
            return self._shard_idx[task.shard]
        if self.teacher_logits is not None:
            return np.arange(self._data.shard(task.shard).rows, dtype=np.int32)
        return None

    def kind(self, task: Task) -> str:
        if task.kind == "gradient":
            return "gradient"
        return "train" if self.teacher_logits is None else "distill"

    def distill_fields(self, task: Task) -> dict[str, Any]:
        """A distill task carries its shard's teacher logits (docs/coordinator.md)."""
        if self.kind(task) != "distill":
            return {}
        assert self.teacher_logits is not None
        return {
            "teacher_logits": self.teacher_logits[self._shard_idx[task.shard]],
            "temperature": self._job.distill.temperature,
            "distill_alpha": self._job.distill.alpha,
        }
