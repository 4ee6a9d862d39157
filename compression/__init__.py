"""Update codecs for thin links and model compression of trained Params.

Only the numpy-only parts are re-exported here, because the protocol imports
``compression.codecs`` on every side; model compression (``prune``, ``quantize``,
``distill``, ``report``, ``pipeline``) pulls in numba and the nn core, so import
those modules directly.
"""

from compression import topk, uniform  # noqa: F401  (registers the codecs)
from compression.codecs import Codec, CodecError, CodecId, check_registry, get, names, register
from compression.feedback import ErrorFeedback
from compression.versions import VersionHistory

check_registry()

__all__ = [
    "Codec",
    "CodecError",
    "CodecId",
    "ErrorFeedback",
    "VersionHistory",
    "get",
    "names",
    "register",
]
