"""``crowdgrad compress``: make a trained model small enough to run on every player.

Distils into a smaller architecture, prunes (whole neurons or single weights,
then fine-tunes) and quantizes to int8, in that order; writes the result and a
JSON report of size, accuracy and per-sample latency before and after. The
result exports to ONNX or safetensors with ``crowdgrad checkpoint export
--model`` (docs/formats.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from compression.pipeline import PRUNE_MODES, QUANTIZE, CompressConfig, compress
from compression.quantize import QuantizedModel
from compression.report import compare
from crowdgrad.cli import UsageError
from nn.data import load_dataset
from nn.modelfile import load_model, save_model
from nn.spec import parse_widths


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compress", help="prune, quantize and distill a trained model", description=__doc__
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="model file (.npz, nn.modelfile)")
    p.add_argument("-o", "--output", required=True, help="where to write the compressed model")
    p.add_argument("--prune", type=float, default=0.0, help="fraction to prune, e.g. 0.5")
    p.add_argument("--prune-mode", choices=PRUNE_MODES, default="structured")
    p.add_argument("--finetune-steps", type=int, default=300)
    p.add_argument("--quantize", choices=QUANTIZE, help="post-training quantization")
    p.add_argument("--distill", metavar="WIDTHS", help="student widths, e.g. 64,32,10")
    p.add_argument("--distill-steps", type=int, default=3000)
    p.add_argument("--temperature", type=float, default=4.0)
    p.add_argument("--alpha", type=float, default=0.7, help="weight of the soft targets")
    p.add_argument("--data", default="digits", help="dataset for fine-tuning and the report")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", help="report path (default: OUTPUT with .report.json)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    src = Path(args.checkpoint)
    if not src.is_file():
        raise UsageError(f"checkpoint {src} does not exist (expected a model .npz file)")
    params, _, metadata = load_model(src)
    config = CompressConfig(
        distill_widths=parse_widths(args.distill) if args.distill else None,
        distill_steps=args.distill_steps,
        temperature=args.temperature,
        alpha=args.alpha,
        prune=args.prune,
        prune_mode=args.prune_mode,
        finetune_steps=args.finetune_steps,
        quantize=args.quantize,
        seed=args.seed,
    )
    data = load_dataset(args.data, seed=args.seed)
    result = compress(params, data, config)
    out = Path(args.output)
    meta = {"source": str(src), "stages": result.stages, "source_metadata": metadata}
    if isinstance(result.model, QuantizedModel):
        result.model.save(out, metadata=meta)
    else:
        save_model(out, result.model, metadata=meta)
    report = {
        "checkpoint": str(src),
        "output": str(out),
        "output_file_bytes": out.stat().st_size,
        "dataset": args.data,
        "stages": result.stages,
        **compare(result.before, result.after),
    }
    report_path = Path(args.report) if args.report else out.with_suffix(".report.json")
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return 0
    table = Table(title=f"crowdgrad compress: {src.name} -> {out.name}")
    for col in ("", "widths", "size (bytes)", "nonzero weights", "accuracy", "latency (µs/sample)"):
        table.add_column(col, justify="right")
    for name, s in (("before", result.before), ("after", result.after)):
        table.add_row(
            name, ",".join(map(str, s.widths)), f"{s.size_bytes:,}", f"{s.nonzero_weights:,}",
            f"{s.accuracy:.4f}", f"{s.latency_us:.1f}",
        )  # fmt: skip
    console = Console()
    console.print(table)
    for stage in result.stages:
        console.print(f"  • {stage}")
    console.print(
        f"size ÷{report['size_ratio']:.1f}, accuracy {report['accuracy_delta']:+.4f}, "
        f"latency ×{1 / report['latency_ratio']:.2f}; report: {report_path}"
    )
    console.print(
        f"To run it outside crowdgrad: crowdgrad checkpoint export --model {out} "
        f"--out {out.with_suffix('.onnx')} (or .safetensors; docs/formats.md)",
        markup=False,
        highlight=False,
    )
    return 0
