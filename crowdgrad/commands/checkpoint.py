"""``crowdgrad checkpoint list|show|verify|restore|export``: operate a checkpoint store.

Readers (list, show, verify, export) open the store without creating or
modifying it and read one consistent snapshot per checkpoint, so they are safe
to run while a coordinator writes. ``restore`` writes: it saves the chosen
version again as the new newest one (history is kept).

``export`` writes a checkpoint (``--store``) or a model file (``--model``, from
``crowdgrad train --save`` or ``crowdgrad compress``: pruned, int8, distilled)
as ``.npz``, ``.safetensors`` or ``.onnx``; docs/formats.md describes each:

  crowdgrad checkpoint export --store run.db --out model.onnx
  crowdgrad checkpoint export --model small.npz --format safetensors --out small
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from coordinator.runtime.persist import ending_of
from crowdgrad.export import (
    FORMATS,
    ExportError,
    describe,
    export_model,
    format_for,
    load_model_file,
    output_path,
)
from storage import CheckpointStore, NoCheckpoint, StorageError

ACTIONS = ("list", "show", "verify", "restore", "export")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "checkpoint",
        help="list, show, verify, restore or export stored checkpoints",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("--store", type=Path, help="store file (SQLite)")
    p.add_argument("--version", type=int, default=None, help="checkpoint version (default: latest)")
    p.add_argument(
        "--model",
        type=Path,
        help="export: a model file (from train --save or compress) instead of --store",
    )
    p.add_argument("--out", type=Path, default=None, help="export: output file")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="export: npz, safetensors or onnx (default: from --out's suffix, else npz)",
    )
    p.add_argument(
        "--softmax", action="store_true", help="export --format onnx: end the graph in a softmax"
    )
    p.add_argument("--full", action="store_true", help="show: everything stored, not a summary")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _open(args: argparse.Namespace, *, write: bool = False) -> CheckpointStore:
    if args.store is None:
        if args.action == "export":
            raise ValueError(
                "export: give --store FILE (a checkpoint store) or --model FILE "
                "(a model file from train --save or compress)"
            )
        raise ValueError(f"{args.action}: --store FILE is required")
    if not args.store.exists():
        raise ValueError(f"--store: {args.store} does not exist")
    return CheckpointStore.open(args.store, readonly=not write)


def _latest(store: CheckpointStore, version: int | None) -> int:
    if version is not None:
        return version
    versions = store.versions()
    if not versions:
        raise NoCheckpoint("the store holds no checkpoint")
    return versions[-1]


def run(args: argparse.Namespace) -> int:
    console = Console()
    try:
        if args.action == "export" and args.model is not None:
            if args.store is not None:
                raise ValueError(
                    "export: give --store (a checkpoint) or --model (a file), not both"
                )
            return _export_file(args)
        if args.action == "restore":
            if args.version is None:
                raise ValueError("restore: --version is required")
            with _open(args, write=True) as store:
                info = store.restore(args.version)
            if args.json:
                _out(json.dumps({"restored_from": args.version, "version": info.version}))
            else:
                _out(
                    f"Restored checkpoint v{args.version} of {args.store} as its newest "
                    f"checkpoint, v{info.version} (history is kept). A coordinator started with "
                    f"--store {args.store} carries on from it."
                )
            return 0
        with _open(args) as store:
            match args.action:
                case "list":
                    return _list(console, args, store)
                case "show":
                    return _show(console, args, store)
                case "verify":
                    return _verify(console, args, store)
                case "export":
                    return _export(args, store)
    except StorageError as exc:
        raise ValueError(str(exc)) from None
    raise AssertionError(f"unhandled action {args.action}")


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _list(console: Console, args: argparse.Namespace, store: CheckpointStore) -> int:
    infos = store.list()
    if args.json:
        rows = [
            {
                "version": i.version,
                "created_at": i.created_at,
                "nbytes": i.nbytes,
                "n_chunks": i.n_chunks,
                "quarantined": i.quarantined,
                "widths": list(i.widths),
                "n_applied": i.n_applied,
                "base": i.base,
                "metadata": i.metadata,
            }
            for i in infos
        ]
        _out(json.dumps(rows))
        return 0
    table = Table(title=f"checkpoints in {args.store}")
    for col in ("version", "created (UTC)", "MB", "chunks", "widths", "applied", "note"):
        table.add_column(col)
    for i in infos:
        note = "QUARANTINED" if i.quarantined else ""
        if "restored_from" in i.metadata:
            note = f"restored from v{i.metadata['restored_from']} {note}".strip()
        if i.base is not None:  # the rest of its chunks are an earlier version's
            note = f"patch on v{i.base} {note}".strip()
        table.add_row(
            str(i.version),
            _when(i.created_at),
            f"{i.nbytes / 1e6:.2f}",
            str(i.n_chunks),
            ",".join(map(str, i.widths)),
            str(i.n_applied),
            note,
        )
    console.print(table)
    return 0


def _state_summary(state: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (f"array {v.dtype} {list(v.shape)}" if isinstance(v, np.ndarray) else v)
        for k, v in state.items()
    }


def _show(console: Console, args: argparse.Namespace, store: CheckpointStore) -> int:
    ckpt = store.load(_latest(store, args.version))
    everything = {
        "version": ckpt.version,
        "created_at": ckpt.created_at,
        "spec": ckpt.spec.to_dict(),
        "num_params": ckpt.spec.num_params,
        "metadata": dict(ckpt.metadata),
        "optimizer": _state_summary(dict(ckpt.optimizer)),
        "strategy": _state_summary(dict(ckpt.strategy)),
        "applied_results": len(ckpt.applied_results),
    }
    if args.json or args.full:
        _out(json.dumps(everything, indent=2, default=str))
        return 0
    for line in summary_lines(everything, store=str(args.store)):
        _out(line)
    return 0


def summary_lines(shown: dict[str, Any], *, store: str) -> list[str]:
    """The few lines ``checkpoint show`` prints: what a person asks of a checkpoint."""
    spec, meta = shown["spec"], shown["metadata"]
    widths = "-".join(map(str, spec["widths"]))
    lines = [
        f"Checkpoint v{shown['version']} in {store}, written {_when(shown['created_at'])} UTC",
        f"  model:      {widths} ({', '.join(spec['activations'])}; {spec['loss']}), "
        f"{shown['num_params']:,} parameters ({4 * shown['num_params'] / 1e3:,.1f} kB)",
    ]
    job = meta.get("job")
    strategy = meta.get("strategy")
    if job is not None or strategy is not None:
        lines.append(f"  job:        {job or '?'}, {strategy or '?'}")
    lines.append(f"  results:    {shown['applied_results']:,} applied")
    rows = ((meta.get("history") or {}).get("evaluations") or {}).get("rows") or []
    if rows:
        _, version, acc, loss = rows[-1][:4]
        lines.append(f"  evaluated:  accuracy {acc:.4f}, loss {loss:.4f} at v{version}")
    else:
        lines.append("  evaluated:  no evaluation stored")
    state = [k for k in ("optimizer", "strategy") if shown[k]]
    if state:
        lines.append(f"  state:      {' and '.join(state)} state stored")
    if "restored_from" in meta:
        lines.append(f"  restored:   from v{meta['restored_from']}")
    ended = ending_of(meta)
    if ended is not None:
        acc = ended.get("accuracy")
        at = f"v{ended.get('version')}" + ("" if acc is None else f", accuracy {acc:.4f}")
        lines.append(
            f"  ended:      {ended.get('reason')} at {at} (a restart ends again unless "
            "the job lifts that stop)"
        )
    lines.append("(--full: everything stored; --json: the same, machine-readable)")
    return lines


def _verify(console: Console, args: argparse.Namespace, store: CheckpointStore) -> int:
    reports = store.verify(args.version)
    bad = [r for r in reports if not r.ok]
    if args.json:
        _out(json.dumps([{"version": r.version, "ok": r.ok, "reason": r.reason} for r in reports]))
    else:
        for r in reports:
            if r.ok:
                console.print(f"v{r.version}: ok")
            else:
                console.print(f"v{r.version}: [bold red]CORRUPT[/] {r.reason}")
        console.print(f"{len(reports) - len(bad)} ok, {len(bad)} corrupt")
    return 1 if bad else 0


def _target(args: argparse.Namespace) -> tuple[str, Path]:
    if args.out is None:
        raise ValueError("export: --out FILE is required (.npz, .safetensors or .onnx)")
    fmt = format_for(args.out, args.format)
    if args.softmax and fmt != "onnx":
        raise ValueError("export: --softmax goes with --format onnx only")
    return fmt, output_path(args.out, fmt)


def _exported(args: argparse.Namespace, what: str, model: Any, out: Path, fmt: str) -> str:
    size = out.stat().st_size
    line = f"Exported {what} ({describe(model)}) to {out} ({fmt}, {size:,} bytes)."
    spec = model.spec
    if fmt == "onnx":
        last = "probabilities" if args.softmax else "raw outputs, before any softmax"
        line += (
            f" Run it with onnxruntime: input 'input' float32 [batch, {spec.widths[0]}], "
            f"output 'output' [batch, {spec.widths[-1]}] ({last})."
        )
    elif fmt == "safetensors":
        line += " Tensors layers.N.weight [out, in] and layers.N.bias, per docs/formats.md."
    return line


def _export(args: argparse.Namespace, store: CheckpointStore) -> int:
    fmt, out = _target(args)
    ckpt = store.load(_latest(store, args.version))
    meta = {"checkpoint_version": ckpt.version, "source": str(args.store)}
    if fmt != "npz":
        export_model(ckpt.params, out, fmt, metadata=meta, softmax=args.softmax)
        _report(args, f"checkpoint v{ckpt.version} of {args.store}", ckpt.params, out, fmt, {})
        return 0
    extra: dict[str, np.ndarray] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for kind in ("optimizer", "strategy"):
        scalars[kind] = {}
        for name, value in dict(getattr(ckpt, kind)).items():
            if isinstance(value, np.ndarray):
                extra[f"{kind}.{name}"] = value
            else:
                scalars[kind][name] = value
    manifest = {
        "version": ckpt.version,
        "created_at": ckpt.created_at,
        "spec": ckpt.spec.to_dict(),
        "metadata": dict(ckpt.metadata),
        "scalars": scalars,
        "arrays": sorted(extra),
        "applied_results": list(ckpt.applied_results),
        "source": str(args.store),
    }
    export_model(ckpt.params, out, "npz", extra=extra, metadata=meta)
    manifest_path = out.with_suffix(".json")
    manifest_path.write_text(json.dumps(manifest, indent=2))
    _report(
        args,
        f"checkpoint v{ckpt.version} of {args.store}",
        ckpt.params,
        out,
        fmt,
        {"manifest": str(manifest_path)},
    )
    return 0


def _export_file(args: argparse.Namespace) -> int:
    if args.version is not None:
        raise ValueError("export: --version picks a checkpoint of --store, not of --model")
    fmt, out = _target(args)
    try:
        model, metadata = load_model_file(args.model)
    except ExportError:
        raise
    except ValueError as exc:
        raise ValueError(f"--model: {exc}") from None
    meta = {**metadata, "source": str(args.model)}
    export_model(model, out, fmt, metadata=meta, softmax=args.softmax)
    _report(args, f"model {args.model}", model, out, fmt, {})
    return 0


def _report(
    args: argparse.Namespace, what: str, model: Any, out: Path, fmt: str, more: dict[str, str]
) -> None:
    if args.json:
        _out(json.dumps({fmt: str(out), "format": fmt, "bytes": out.stat().st_size, **more}))
        return
    line = _exported(args, what, model, out, fmt)
    if "manifest" in more:
        line += f" Its manifest (job, optimizer scalars, applied results): {more['manifest']}."
    _out(line)
