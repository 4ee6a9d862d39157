"""``crowdgrad checkpoint list|show|verify|restore|export``: operate a checkpoint store.

Readers (list, show, verify, export) open the store without creating or
modifying it and read one consistent snapshot per checkpoint, so they are safe
to run while a coordinator writes. ``restore`` writes: it saves the chosen
version again as the new newest one (history is kept).
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

from nn.modelfile import save_model
from storage import CheckpointStore, NoCheckpoint, StorageError

ACTIONS = ("list", "show", "verify", "restore", "export")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "checkpoint", help="list, show, verify, restore or export stored checkpoints"
    )
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("--store", required=True, type=Path, help="store file (SQLite)")
    p.add_argument("--version", type=int, default=None, help="checkpoint version (default: latest)")
    p.add_argument("--out", type=Path, default=None, help="export: output .npz path")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _open(args: argparse.Namespace, *, write: bool = False) -> CheckpointStore:
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
        if args.action == "restore":
            if args.version is None:
                raise ValueError("restore: --version is required")
            with _open(args, write=True) as store:
                info = store.restore(args.version)
            _emit(console, args, {"restored_from": args.version, "version": info.version})
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
                    return _export(console, args, store)
    except StorageError as exc:
        raise ValueError(str(exc)) from None
    raise AssertionError(f"unhandled action {args.action}")


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _emit(console: Console, args: argparse.Namespace, obj: Any) -> None:
    if args.json:
        _out(json.dumps(obj, indent=None if isinstance(obj, list) else 2))
    else:
        console.print(obj)


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
    _emit(
        console,
        args,
        {
            "version": ckpt.version,
            "created_at": ckpt.created_at,
            "spec": ckpt.spec.to_dict(),
            "num_params": ckpt.spec.num_params,
            "metadata": dict(ckpt.metadata),
            "optimizer": _state_summary(dict(ckpt.optimizer)),
            "strategy": _state_summary(dict(ckpt.strategy)),
            "applied_results": len(ckpt.applied_results),
        },
    )
    return 0


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


def _export(console: Console, args: argparse.Namespace, store: CheckpointStore) -> int:
    if args.out is None:
        raise ValueError("export: --out FILE.npz is required")
    ckpt = store.load(_latest(store, args.version))
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
    out = args.out if args.out.suffix == ".npz" else args.out.with_suffix(".npz")
    save_model(out, ckpt.params, extra=extra, metadata={"checkpoint_version": ckpt.version})
    manifest_path = out.with_suffix(".json")
    manifest_path.write_text(json.dumps(manifest, indent=2))
    _emit(console, args, {"npz": str(out), "manifest": str(manifest_path)})
    return 0
