"""Error feedback: what a lossy codec dropped is added to the next update.

A biased codec (top-k above all) loses the small coordinates every round; with
error feedback the sender keeps that loss as a residual per block and folds it
into the next update of the same block, so nothing is lost for good, only late:
the sum of decoded updates tracks the sum of true updates within one residual.
This is sender state, so it lives here and not in the stateless codecs.

Call-order contract: ``encode(key, x)`` once per block per update; the payload it
returns must be what is sent (the residual assumes the receiver decodes exactly
that). ``reset`` after a task is dropped, if the dropped update should not count.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from compression.codecs import Codec, CodecError, _as_block


class ErrorFeedback:
    """Wraps a codec with a residual per block key (e.g. a NeuronGroup and "W"/"b")."""

    __slots__ = ("_residual", "codec")

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self._residual: dict[Hashable, np.ndarray] = {}

    def encode(
        self, key: Hashable, x: np.ndarray, *, rng: np.random.Generator | None = None
    ) -> bytes:
        """Encode ``x + residual[key]`` and keep what the receiver will not see."""
        x = _as_block(x)
        r = self._residual.get(key)
        if r is not None and r.shape != x.shape:
            raise CodecError(f"error feedback: block {key!r} changed shape {r.shape} -> {x.shape}")
        corrected = x + r if r is not None else x.copy()
        payload = self.codec.encode(corrected, rng=rng)
        if self.codec.lossless:
            self._residual.pop(key, None)
        else:
            corrected -= self.codec.decode(payload, x.shape)
            self._residual[key] = corrected
        return payload

    def residual(self, key: Hashable) -> np.ndarray | None:
        """What is still owed for ``key`` (a copy), or None if nothing is."""
        r = self._residual.get(key)
        return None if r is None else r.copy()

    def blocks(self) -> list[Hashable]:
        """The blocks that owe a residual, in the order they were first encoded."""
        return list(self._residual)

    def residual_norm(self) -> float:
        """L2 norm over all residuals: a cheap health signal (it must stay bounded)."""
        return float(
            np.sqrt(sum(float(np.dot(r.ravel(), r.ravel())) for r in self._residual.values()))
        )

    def reset(self, key: Hashable | None = None) -> None:
        """Forget one block's residual, or all of them."""
        if key is None:
            self._residual.clear()
        else:
            self._residual.pop(key, None)

    def __len__(self) -> int:
        return len(self._residual)
