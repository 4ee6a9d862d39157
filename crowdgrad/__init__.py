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

from nn.spec import ModelSpec

__all__ = ["ModelSpec", "ServeResult", "__version__", "serve"]


def __getattr__(name: str) -> object:
    # ``serve`` pulls in the server stack; import it only when asked for.
    if name in ("serve", "ServeResult"):
        from crowdgrad import api

        return getattr(api, name)
    raise AttributeError(f"module 'crowdgrad' has no attribute {name!r}")
