#!/usr/bin/env python3
"""Write a synthetic DeepSeek-V3.2 / GLM-5 checkpoint at the published widths (random weights).

    python tools/make_synthetic_checkpoint.py --kind deepseek_v32 --layers 6 --dense-layers 3 \\
        --experts 16 --precision fp8 -o /path/to/ckpt

Real per-layer widths and vocabulary unless --narrow / --vocab / --set say otherwise; sharded
safetensors with model.safetensors.index.json, config.json and generation_config.json, as the
published checkpoints are stored (see docs/synthetic.md). Prints the bytes per layer, the total
and the time taken; --dry-run prints the sizes without writing anything.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from dsa_export.errors import DSAUserError
from dsa_export.hf import synthetic

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """``"4GB"``, ``"500MB"``, ``"5GiB"`` or a plain number of bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size such as 4GB, 500MB or 5GiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def parse_override(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` with VALUE read as JSON when it parses (numbers, lists, objects), else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"'{text}' is not KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=synthetic.KINDS, default="deepseek_v32")
    parser.add_argument("--layers", type=int, required=True, help="num_hidden_layers")
    parser.add_argument("--dense-layers", type=int, required=True, help="leading layers with a dense MLP")
    parser.add_argument("--experts", type=int, required=True, help="routed experts per MoE layer")
    parser.add_argument("--precision", choices=synthetic.PRECISIONS, default="bf16")
    parser.add_argument("--vocab", type=int, help="vocabulary size (default: the published one)")
    parser.add_argument("--shard-size", type=parse_size, default=synthetic.DEFAULT_SHARD_BYTES,
                        help="tensor bytes per shard, e.g. 4GB (default 5GB)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--index-topk", type=int, help="indexer top-k (default: the published 2048)")
    parser.add_argument("--mtp", action="store_true", help="also write the MTP layer model.layers.<layers>")
    parser.add_argument("--narrow", action="store_true", help="narrow test widths (hidden 256), not the real ones")
    parser.add_argument("--set", dest="overrides", type=parse_override, action="append", default=[],
                        metavar="KEY=VALUE", help="a config field, e.g. index_topk_freq=4 (repeatable)")
    parser.add_argument("--overwrite", action="store_true", help="replace a checkpoint already in the output directory")
    parser.add_argument("--dry-run", action="store_true", help="print the sizes, write nothing")
    parser.add_argument("-o", "--output", type=Path, help="checkpoint directory (required unless --dry-run)")
    args = parser.parse_args(argv)
    if args.output is None and not args.dry_run:
        parser.error("-o/--output is required unless --dry-run is given")

    overrides = dict(synthetic.NARROW[args.kind]) if args.narrow else {}
    overrides.update(dict(args.overrides))
    common = dict(layers=args.layers, dense_layers=args.dense_layers, experts=args.experts,
                  precision=args.precision, vocab_size=args.vocab, shard_bytes=args.shard_size, seed=args.seed,
                  index_topk=args.index_topk, mtp=args.mtp, **overrides)
    try:
        if args.dry_run:
            print(synthetic.describe(synthetic.plan_checkpoint(args.kind, **common)))
            return 0
        info = synthetic.write_checkpoint(args.output, args.kind, overwrite=args.overwrite,
                                          progress=lambda line: print(line, flush=True), **common)
    except DSAUserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(info.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
