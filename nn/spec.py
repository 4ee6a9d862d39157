"""ModelSpec: the shape of an MLP, its activations, loss and initialisation.

A spec is small, frozen and serialisable (``to_dict``/``from_dict``) because it
travels: in job files, in checkpoints and in the ``task`` message. It never holds
weights, so even the 2.1 B-parameter ``extreme`` preset is just counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from nn.params import Params

ACTIVATIONS = ("relu", "tanh", "sigmoid", "identity")
LOSSES = ("mse", "softmax_ce")
INITS = ("he", "xavier")
#: Seeded-init schemes (``task.init_scheme``, docs/protocol.md §3.3): the portable
#: one every client can reproduce, and NumPy's PCG64 of older coordinators.
INIT_SCHEME = "x128ss-ih12"
LEGACY_INIT_SCHEME = "pcg64"
INIT_SCHEMES = (INIT_SCHEME, LEGACY_INIT_SCHEME)

#: The seed's presets (brief, "Model presets"): widths including input and output.
#: The seed's table 4.1 lists medium as [10, 128, 128, 128, 10] but counts 19,210
#: parameters, which is exactly [10, 128, 128, 10] (three 128-wide hidden layers
#: would be 35,722). Every seed timing scales with the count, so we keep the count.
PRESETS: dict[str, tuple[int, ...]] = {
    "tiny": (5, 5, 5, 5, 3),
    "small": (10, 16, 16, 16, 10),
    "medium": (10, 128, 128, 10),
    "large": (10, 1024, 1024, 1024, 10),
    "huge": (10, 4096, 4096, 4096, 10),
    "extreme": (10, 32768, 32768, 32768, 10),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Widths ``[in, hidden..., out]``, one activation per layer, a loss and an init.

    ``activations`` defaults to ReLU on hidden layers and identity on the output
    layer, which is what both losses expect (softmax is folded into the loss).
    """

    widths: tuple[int, ...]
    activations: tuple[str, ...] = field(default=())
    loss: str = "softmax_ce"
    init: str = "he"
    # Derived once: the coordinator asks for shapes and sizes on every lease.
    _shapes: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)
    _num_params: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        widths = tuple(int(w) for w in self.widths)
        if len(widths) < 2:
            raise ValueError(f"widths: need at least input and output, got {list(widths)}")
        if any(w < 1 for w in widths):
            raise ValueError(f"widths: every width must be >= 1, got {list(widths)}")
        object.__setattr__(self, "widths", widths)
        n = len(widths) - 1
        acts = tuple(self.activations) or ("relu",) * (n - 1) + ("identity",)
        if len(acts) != n:
            raise ValueError(f"activations: need {n} (one per layer), got {len(acts)}")
        for i, a in enumerate(acts):
            if a not in ACTIVATIONS:
                raise ValueError(
                    f"activations[{i}]: unknown activation {a!r}; expected one of {ACTIVATIONS}"
                )
        object.__setattr__(self, "activations", acts)
        if self.loss not in LOSSES:
            raise ValueError(f"loss: unknown loss {self.loss!r}; expected one of {LOSSES}")
        if self.init not in INITS:
            raise ValueError(f"init: unknown init {self.init!r}; expected one of {INITS}")
        shapes = tuple((widths[i + 1], widths[i]) for i in range(n))
        object.__setattr__(self, "_shapes", shapes)
        object.__setattr__(self, "_num_params", sum(o * i + o for o, i in shapes))

    # -- construction ---------------------------------------------------------------

    @classmethod
    def preset(cls, name: str, *, loss: str = "mse", **kwargs: Any) -> ModelSpec:
        """A seed preset. The seed trains them as regressors, hence ``mse``."""
        try:
            widths = PRESETS[name]
        except KeyError:
            raise ValueError(
                f"preset: unknown preset {name!r}; expected one of {tuple(PRESETS)}"
            ) from None
        return cls(widths=widths, loss=loss, **kwargs)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelSpec:
        """Inverse of ``to_dict``; unknown keys are an error, not silently dropped."""
        allowed = {"widths", "activations", "loss", "init"}
        extra = set(d) - allowed
        if extra:
            raise ValueError(f"model spec: unknown field(s) {sorted(extra)}")
        if "widths" not in d:
            raise ValueError("model spec: missing field 'widths'")
        return cls(
            widths=tuple(d["widths"]),
            activations=tuple(d.get("activations", ())),
            loss=d.get("loss", "softmax_ce"),
            init=d.get("init", "he"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "widths": list(self.widths),
            "activations": list(self.activations),
            "loss": self.loss,
            "init": self.init,
        }

    # -- shape arithmetic -----------------------------------------------------------

    @property
    def num_layers(self) -> int:
        return len(self.widths) - 1

    @property
    def layer_shapes(self) -> tuple[tuple[int, int], ...]:
        """``(out, in)`` per layer, the shape of its W."""
        return self._shapes

    @property
    def num_params(self) -> int:
        """Weights plus biases, as exact Python ints (extreme exceeds int32)."""
        return self._num_params

    @property
    def nbytes(self) -> int:
        return 4 * self.num_params

    def flops_per_sample(self, *, train: bool = True) -> int:
        """Multiply-adds counted as 2 FLOPs: 2·P forward, 6·P for a train step."""
        weights = sum(o * i for o, i in self.layer_shapes)
        return (6 if train else 2) * weights

    def layer_offsets(self) -> list[tuple[int, int, int]]:
        """Per layer ``(w_start, b_start, end)`` in the flat Params buffer."""
        out = []
        pos = 0
        for o, i in self.layer_shapes:
            out.append((pos, pos + o * i, pos + o * i + o))
            pos += o * i + o
        return out

    # -- initialisation -------------------------------------------------------------

    def init_std(self, layer: int) -> float:
        """Layer ``layer``'s weight scale in float64: He ``sqrt(2/fan_in)`` for ReLU
        networks, Xavier ``sqrt(2/(fan_in + fan_out))`` for tanh/sigmoid ones."""
        o, i = self.layer_shapes[layer]
        return math.sqrt(2.0 / i) if self.init == "he" else math.sqrt(2.0 / (i + o))

    def init_params(self, seed: int, *, scheme: str = INIT_SCHEME) -> Params:
        """Fresh weights from ``seed``; biases are zero.

        ``x128ss-ih12`` (the default, docs/protocol.md §12.3): layer l's W, row-major,
        from the portable generator ``nn.rng.Xoshiro128ss(seed, l)`` as Irwin–Hall
        normals times ``init_std(l)``, so a client in any language builds the same
        version 0. ``pcg64``: NumPy's ``default_rng(seed)`` standard normals, the
        scheme of older coordinators and of the built-in datasets' teachers.
        """
        from nn.params import Params  # local: params imports spec

        if scheme not in INIT_SCHEMES:
            raise ValueError(f"init scheme: unknown {scheme!r}; expected one of {INIT_SCHEMES}")
        if self.num_params > 2**31:
            raise ValueError(
                f"model spec: {self.num_params:,} parameters is too many to allocate; "
                "presets this large are counted and simulated, never materialised"
            )
        params = Params.zeros(self)
        if scheme == LEGACY_INIT_SCHEME:
            rng = np.random.default_rng(seed)
            for l, W in enumerate(params.W):
                W[...] = rng.standard_normal(W.shape, dtype=np.float32) * np.float32(
                    self.init_std(l)
                )
            return params
        from nn.rng import Xoshiro128ss  # local: numba compiles on first use only

        for l, W in enumerate(params.W):
            Xoshiro128ss(seed, l).normal_into(W.reshape(-1), self.init_std(l))
        return params


def parse_widths(text: str | Sequence[int]) -> tuple[int, ...]:
    """``"64,128,10"`` or a sequence → widths; names what was wrong on failure."""
    if isinstance(text, str):
        parts = [p.strip() for p in text.split(",") if p.strip()]
        try:
            return tuple(int(p) for p in parts)
        except ValueError:
            raise ValueError(f"widths: expected comma-separated integers, got {text!r}") from None
    return tuple(int(w) for w in text)
