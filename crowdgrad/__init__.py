"""crowdgrad: train neural networks on volunteer compute.

The top-level package is the facade: the version, the CLI and, as the parts land,
the two-line Python API. The parts themselves live in the sibling packages
``nn``, ``protocol``, ``compression``, ``coordinator``, ``storage``, ``client`` and
``simulations``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("crowdgrad")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+local"

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crowdgrad.api import ServeResult, serve
    from nn.spec import ModelSpec

__all__ = ["ModelSpec", "ServeResult", "__version__", "serve"]


def __getattr__(name: str) -> object:
    # Imported when asked for: ``serve`` pulls in the server stack, and ``ModelSpec``
    # numpy, which the CLI must not load before it has told OpenBLAS how many
    # threads to start (crowdgrad.cli.main).
    if name in ("serve", "ServeResult"):
        from crowdgrad import api

        return getattr(api, name)
    if name == "ModelSpec":
        from nn.spec import ModelSpec

        return ModelSpec
    raise AttributeError(f"module 'crowdgrad' has no attribute {name!r}")
