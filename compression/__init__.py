"""Update codecs for thin links and model compression of trained Params."""

from compression.codecs import Codec, CodecError, CodecId, check_registry, get, names, register

check_registry()

__all__ = ["Codec", "CodecError", "CodecId", "get", "names", "register"]
