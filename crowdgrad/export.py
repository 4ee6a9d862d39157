"""Models out: a trained or compressed model as ``.npz``, ``.safetensors`` or ``.onnx``.

Why three: the ``.npz`` is crowdgrad's own hand-off format (``nn.modelfile``,
``compression.quantize``) and keeps everything, optimizer state included;
safetensors is what other frameworks load weights from without running code;
ONNX carries the computation too, so any onnxruntime (a game engine's, a
browser's) can run the model with no crowdgrad at all. docs/formats.md is the
reference for every layout written here; keep the two in step.

Choices, documented there as well:

- The ONNX graph ends at the last layer's raw outputs (logits for a
  ``softmax_ce`` model), as crowdgrad's own forward pass does; ``softmax=True``
  appends a ``Softmax(axis=1)``.
- An int8 model stays int8 in both foreign formats: safetensors stores the int8
  weights beside their per-row scales, and the ONNX graph dequantizes them with
  ``DequantizeLinear`` (per output row, zero point 0), so the file keeps its 4x
  saving and the runtime computes ``scale[j] * q[j, k]`` exactly as
  ``QuantizedModel.dequantize`` does.
- ``onnx`` and ``safetensors`` are the optional extra ``export``; a missing one is
  an :class:`ExportError` that says how to install it, never an ImportError.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from compression.quantize import FORMAT as QFORMAT
from compression.quantize import SCHEME, QuantizedModel, is_quantized_file, load_quantized
from nn.modelfile import FORMAT, FORMAT_VERSION, load_model, save_model
from nn.params import Params

FORMATS = ("npz", "safetensors", "onnx")
SUFFIXES = {"npz": ".npz", "safetensors": ".safetensors", "onnx": ".onnx"}
#: ONNX operator set: Gemm, Relu/Tanh/Sigmoid, Softmax(axis) and per-axis
#: DequantizeLinear all exist in this form since opset 13.
ONNX_OPSET = 13
#: ONNX IR version 8 (ONNX 1.10): loads in every onnxruntime of the last years.
ONNX_IR_VERSION = 8
#: One protobuf message holds at most 2 GiB; keep room for the graph itself.
ONNX_MAX_BYTES = 2**31 - 2**24
ONNX_ACTIVATIONS = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "identity": None}

Model = Params | QuantizedModel


class ExportError(ValueError):
    """An export that cannot be done; the message says why and what to do instead."""


def _require(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        raise ExportError(
            f"this export needs the {package!r} package, which is not installed: "
            "pip install 'crowdgrad[export]'"
        ) from None


def format_for(path: Path, fmt: str | None) -> str:
    """The format asked for, else the one ``path``'s suffix names, else npz."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ExportError(f"format: unknown {fmt!r}; expected one of {', '.join(FORMATS)}")
        return fmt
    by_suffix = {s: f for f, s in SUFFIXES.items()}
    return by_suffix.get(path.suffix.lower(), "npz")


def output_path(path: Path, fmt: str) -> Path:
    """``path`` with the format's suffix, refusing a clash and a missing directory.

    A missing directory is an error rather than created: a typo in ``--out`` should
    not leave a stray tree behind.
    """
    suffix = SUFFIXES[fmt]
    if path.suffix.lower() != suffix:
        if path.suffix.lower() in SUFFIXES.values():
            raise ExportError(
                f"{path} ends in {path.suffix} but the format is {fmt}; "
                f"use {path.with_suffix(suffix)}, or --format to match"
            )
        path = path.with_name(path.name + suffix)
    parent = path.parent
    if not parent.exists():
        raise ExportError(f"directory {parent} does not exist; create it first (mkdir -p {parent})")
    if not parent.is_dir():
        raise ExportError(f"{parent} is not a directory")
    if path.is_dir():
        raise ExportError(f"{path} is a directory; give a file name")
    if not os.access(parent, os.W_OK):
        raise ExportError(f"directory {parent} is not writable")
    return path


def load_model_file(path: str | os.PathLike[str]) -> tuple[Model, dict[str, Any]]:
    """A model file from ``crowdgrad train --save``, ``crowdgrad compress`` or an
    npz export: ``(Params or QuantizedModel, metadata)``; a bad file names its fault."""
    path = Path(path)
    if not path.is_file():
        raise ExportError(f"model file {path} does not exist")
    if is_quantized_file(path):
        return load_quantized(path)
    params, _, metadata = load_model(path)
    return params, metadata


def describe(model: Model) -> str:
    """``64-128-10, 9,610 parameters`` (``, int8`` for a quantized model)."""
    spec = model.spec
    kind = ", int8 weights" if isinstance(model, QuantizedModel) else ""
    return f"{'-'.join(map(str, spec.widths))}, {spec.num_params:,} parameters{kind}"


def export_model(
    model: Model,
    path: str | os.PathLike[str],
    fmt: str,
    *,
    metadata: dict[str, Any] | None = None,
    extra: dict[str, np.ndarray] | None = None,
    softmax: bool = False,
) -> Path:
    """Write ``model`` to ``path`` (already checked by :func:`output_path`) as ``fmt``.

    ``extra`` arrays (a checkpoint's optimizer state) travel only in the npz; the
    foreign formats hold the model alone. ``softmax`` applies to ONNX only.
    """
    path = Path(path)
    metadata = metadata or {}
    if extra and fmt != "npz":
        raise ExportError("only the npz format carries optimizer and strategy state")
    if softmax and fmt != "onnx":
        raise ExportError("softmax: only the ONNX graph can end in a softmax")
    if fmt == "npz":
        if isinstance(model, QuantizedModel):
            return model.save(path, metadata=metadata)
        return save_model(path, model, extra=extra, metadata=metadata)
    if fmt == "safetensors":
        _atomic_write(path, to_safetensors(model, metadata=metadata))
        return path
    if fmt == "onnx":
        proto = to_onnx(model, metadata=metadata, softmax=softmax)
        _atomic_write(path, proto.SerializeToString())
        return path
    raise ExportError(f"format: unknown {fmt!r}; expected one of {', '.join(FORMATS)}")


def _atomic_write(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename: a reader never sees half a model."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _header(model: Model, metadata: dict[str, Any]) -> dict[str, str]:
    """The file-level strings both foreign formats carry (docs/formats.md)."""
    quantized = isinstance(model, QuantizedModel)
    head = {
        "format": QFORMAT if quantized else FORMAT,
        "format_version": str(FORMAT_VERSION),
        "spec": json.dumps(model.spec.to_dict()),
        "metadata": json.dumps(metadata, default=str),
    }
    if quantized:
        head["scheme"] = SCHEME
    return head


def to_safetensors(model: Model, *, metadata: dict[str, Any] | None = None) -> bytes:
    """The model as safetensors bytes: ``layers.{l}.weight`` ``[out, in]`` (float32,
    or int8 with ``layers.{l}.weight_scale`` ``[out]``) and ``layers.{l}.bias``."""
    st = _require("safetensors.numpy")
    tensors: dict[str, np.ndarray] = {}
    for li in range(model.spec.num_layers):
        if isinstance(model, QuantizedModel):
            q, s, b = model.layer(li)
            tensors[f"layers.{li}.weight"] = np.ascontiguousarray(q)
            tensors[f"layers.{li}.weight_scale"] = np.ascontiguousarray(s)
        else:
            W, b = model.W[li], model.b[li]
            tensors[f"layers.{li}.weight"] = np.ascontiguousarray(W)
        tensors[f"layers.{li}.bias"] = np.ascontiguousarray(b)
    return bytes(st.save(tensors, metadata=_header(model, metadata or {})))


def to_onnx(model: Model, *, metadata: dict[str, Any] | None = None, softmax: bool = False) -> Any:
    """The model as an ``onnx.ModelProto``: input ``input`` float32 ``[batch, in]``,
    output ``output`` float32 ``[batch, out]``; per layer a ``Gemm`` (``transB=1``:
    W is stored ``[out, in]`` as crowdgrad holds it) and its activation."""
    onnx = _require("onnx")
    from onnx import TensorProto, helper, numpy_helper

    spec = model.spec
    weight_bytes = sum(o * i for o, i in spec.layer_shapes)
    nbytes = weight_bytes * (1 if isinstance(model, QuantizedModel) else 4) + 8 * sum(
        o for o, _ in spec.layer_shapes
    )
    if nbytes > ONNX_MAX_BYTES:
        raise ExportError(
            f"{spec.num_params:,} parameters do not fit one ONNX file (2 GiB protobuf "
            "limit); export safetensors instead"
        )
    inits, nodes = [], []
    x = "input"
    for li in range(spec.num_layers):
        name = f"layers.{li}"
        if isinstance(model, QuantizedModel):
            q, s, b = model.layer(li)
            inits += [
                numpy_helper.from_array(np.ascontiguousarray(q), f"{name}.weight_quantized"),
                numpy_helper.from_array(np.ascontiguousarray(s), f"{name}.weight_scale"),
                numpy_helper.from_array(np.zeros(q.shape[0], np.int8), f"{name}.weight_zero_point"),
            ]
            nodes.append(
                helper.make_node(
                    "DequantizeLinear",
                    [
                        f"{name}.weight_quantized",
                        f"{name}.weight_scale",
                        f"{name}.weight_zero_point",
                    ],
                    [f"{name}.weight"],
                    name=f"{name}.dequantize",
                    axis=0,
                )
            )
        else:
            W, b = model.W[li], model.b[li]
            inits.append(numpy_helper.from_array(np.ascontiguousarray(W), f"{name}.weight"))
        inits.append(numpy_helper.from_array(np.ascontiguousarray(b), f"{name}.bias"))
        z = f"{name}.gemm"
        nodes.append(
            helper.make_node("Gemm", [x, f"{name}.weight", f"{name}.bias"], [z], name=z, transB=1)
        )
        op = ONNX_ACTIVATIONS[spec.activations[li]]
        if op is not None:
            a = f"{name}.{spec.activations[li]}"
            nodes.append(helper.make_node(op, [z], [a], name=a))
            z = a
        x = z
    if softmax:
        nodes.append(helper.make_node("Softmax", [x], ["output"], name="softmax", axis=1))
    else:
        nodes[-1].output[0] = "output"
    graph = helper.make_graph(
        nodes,
        "crowdgrad_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", spec.widths[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", spec.widths[-1]])],
        initializer=inits,
    )
    from crowdgrad import __version__

    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
        producer_name="crowdgrad",
        producer_version=__version__,
        ir_version=ONNX_IR_VERSION,
        doc_string="crowdgrad MLP; docs/formats.md describes inputs, outputs and metadata",
    )
    props = {f"crowdgrad.{k}": v for k, v in _header(model, metadata or {}).items()}
    props["crowdgrad.softmax"] = "true" if softmax else "false"
    helper.set_model_props(proto, props)
    onnx.checker.check_model(proto)
    return proto
