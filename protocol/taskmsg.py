"""The ``task`` message (docs/protocol.md §3.3): a unit of work and how its model
arrives, with the checks between its fields (kinds, distillation, sub-models,
layer-split boundaries, seeded init).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from nn.spec import ModelSpec
from protocol import checks as ck
from protocol.checks import I64, U32, U64, Check
from protocol.errors import ErrorCode, ProtocolError
from protocol.message import TASK_KINDS, Message


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Task(Message):
    """Server -> client: a unit of work. The model is either already held by the
    client (``base_version``) or follows as ``num_chunks`` chunks of transfer
    ``model_transfer`` (shared between tasks so frames can be reused); with
    ``delta_base`` the chunks are ``model_version − delta_base``, to add to the
    client's copy of ``delta_base``. ``error_feedback`` asks the client to carry
    what ``upload_codec`` dropped into its next result. A ``distill`` task trains
    the student toward ``teacher_logits`` (one row per entry of ``indices``) at
    ``temperature``, mixed with the hard labels by ``distill_alpha``. With
    ``init_seed`` (version 0, to a client whose hello listed ``init_scheme`` in
    ``init_schemes``; nil scheme: legacy PCG64, to ``seeded_init``) no model
    follows: the client builds it from the seed and checks its CRC-32 against
    ``init_crc``. A sub-model task (``subnet``) is an ordinary task on a narrower
    ``spec``; ``subnet`` names the job model's hidden neurons it keeps (§3.3.1).
    With ``boundary`` = c (a layer-split job's lower block, §3.3.2) the result
    also carries the activations of hidden layer c, after training, for every
    row the task names (``Result`` layout: the update's blocks, then ``(L, "h")``)."""

    TYPE: ClassVar[str] = "task"
    task_id: str
    kind: str = "train"
    model_version: int
    spec: ModelSpec
    dataset: str
    shard: int = 0
    indices: np.ndarray | None = None
    steps: int = 1
    batch: int = 16
    optimizer: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    deadline: float = 60.0
    base_version: int | None = None
    model_transfer: str | None = None
    num_chunks: int = 0
    upload_codec: str = "fp32"
    error_feedback: bool = False
    delta_base: int | None = None
    teacher_logits: np.ndarray | None = None
    temperature: float = 4.0
    distill_alpha: float = 0.7
    init_seed: int | None = None
    init_crc: int | None = None
    data: str | None = None
    init_scheme: str | None = None
    subnet: np.ndarray | None = None
    boundary: int | None = None

    SPARSE: ClassVar[frozenset[str]] = frozenset({"data", "init_scheme", "subnet", "boundary"})
    SCHEMA: ClassVar[dict[str, Check]] = {
        "task_id": ck.str_of(128, empty=False),
        "kind": ck.str_of(32, TASK_KINDS),
        "model_version": ck.int_in(0, I64),
        "spec": ck.spec,
        "dataset": ck.str_of(128, empty=False),
        "shard": ck.int_in(0, U32),
        "indices": ck.optional(ck.indices),
        "steps": ck.int_in(1, 1_000_000_000),
        "batch": ck.int_in(1, 1 << 20),
        "optimizer": ck.scalars(32),
        "seed": ck.int_in(0, U64),
        "deadline": ck.float_in(0.001, 1e7),
        "base_version": ck.optional(ck.int_in(0, I64)),
        "model_transfer": ck.optional(ck.str_of(128, empty=False)),
        "num_chunks": ck.int_in(0, 1 << 24),
        "upload_codec": ck.str_of(32, empty=False),
        "error_feedback": ck.boolean,
        "delta_base": ck.optional(ck.int_in(0, I64)),
        "teacher_logits": ck.optional(ck.logits),
        "temperature": ck.float_in(1e-3, 1e3),
        "distill_alpha": ck.float_in(0.0, 1.0),
        "init_seed": ck.optional(ck.int_in(0, U64)),
        "init_crc": ck.optional(ck.int_in(0, U32)),
        "data": ck.optional(ck.sha256),
        "init_scheme": ck.optional(ck.str_of(32, empty=False)),
        "subnet": ck.optional(ck.indices),
        "boundary": ck.optional(ck.int_in(1, 65535)),
    }

    def _cross(self) -> None:
        if self.subnet is not None:
            self._cross_subnet(self.subnet)
        if self.boundary is not None:
            hidden = len(self.spec.widths) - 2
            if self.kind != "train" or self.boundary > hidden:
                raise ck.bad(
                    "task.boundary",
                    f"a hidden layer 1..{hidden} of a train task's spec",
                    self.boundary,
                )
        if self.init_seed is not None:
            if (
                self.init_crc is None
                or self.model_version != 0
                or self.num_chunks
                or self.base_version is not None
                or self.delta_base is not None
            ):
                raise ProtocolError(
                    ErrorCode.BAD_FIELD,
                    "task.init_seed: only for model_version 0, with init_crc, no chunks, "
                    "no base_version and no delta_base",
                )
            self._cross_distill()
            return
        if self.init_crc is not None:
            raise ProtocolError(ErrorCode.BAD_FIELD, "task.init_crc: only with init_seed")
        if self.init_scheme is not None:
            raise ProtocolError(ErrorCode.BAD_FIELD, "task.init_scheme: only with init_seed")
        if self.num_chunks and self.model_transfer is None:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, "task.model_transfer: required when num_chunks > 0"
            )
        if self.model_transfer is not None and not self.num_chunks:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, "task.num_chunks: must be > 0 when model_transfer is set"
            )
        if self.base_version is None and not self.num_chunks:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, "task.num_chunks: need base_version or num_chunks > 0"
            )
        if self.delta_base is not None:
            if not self.num_chunks or self.base_version is not None:
                raise ProtocolError(
                    ErrorCode.BAD_FIELD,
                    "task.delta_base: needs model chunks (num_chunks > 0) and no base_version",
                )
            if self.delta_base >= self.model_version:
                raise ck.bad(
                    "task.delta_base", f"< model_version ({self.model_version})", self.delta_base
                )
        self._cross_distill()

    def _cross_subnet(self, subnet: np.ndarray) -> None:
        """§3.3.1: the kept neurons split by the spec's hidden widths, increasing
        within each layer; the slice always travels."""
        hidden = self.spec.widths[1:-1]
        if subnet.size != sum(hidden):
            raise ck.bad(
                "task.subnet", f"{sum(hidden)} indices (spec's hidden widths)", subnet.size
            )
        for layer in np.split(subnet.astype(np.int64), np.cumsum(hidden[:-1], dtype=np.int64)):
            if layer.size > 1 and not bool(np.all(np.diff(layer) > 0)):
                raise ck.bad("task.subnet", "increasing indices within each layer", "not")
        if not self.num_chunks or self.base_version is not None or self.delta_base is not None:
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                "task.subnet: needs its slice as chunks (num_chunks > 0), "
                "no base_version and no delta_base",
            )

    def _cross_distill(self) -> None:
        if self.kind == "distill":
            t = self.teacher_logits
            if t is None or self.indices is None:
                raise ProtocolError(
                    ErrorCode.BAD_FIELD,
                    "task.teacher_logits: a distill task needs them and indices",
                )
            if t.shape != (self.indices.size, self.spec.widths[-1]):
                raise ck.bad(
                    "task.teacher_logits",
                    f"shape [{self.indices.size}, {self.spec.widths[-1]}] (indices × outputs)",
                    t,
                )
