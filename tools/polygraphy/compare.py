"""Compare a dsa-export build with its torch reference through Polygraphy's Comparator.

    python tools/polygraphy/compare.py out/demo [--runtime auto|engine|onnxruntime] [--atol 1e-4 --rtol 1e-4]

Use it where the Polygraphy CLI cannot build the runner (see docs/polygraphy.md): TensorRT-RTX
engines, ONNX Runtime with the TensorRT execution provider and our plugin library, and the torch
reference. Inputs come from ``data_loader.py`` next to this file (its environment variables apply).
Exit code 0 when every output matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path


def _data_loader():
    spec = importlib.util.spec_from_file_location("dsa_data_loader", Path(__file__).with_name("data_loader.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", help="a build folder (with manifest.json)")
    parser.add_argument("--runtime", default="auto", choices=["auto", "engine", "onnxruntime"])
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--check-error-stat", default="elemwise", choices=["elemwise", "max", "mean", "median"])
    args = parser.parse_args(argv)

    import onnx
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    from dsa_export.manifest import read_manifest
    from dsa_export.runtime.polygraphy_runner import SessionRunner
    from dsa_export.runtime.torch_runner import TorchRunner, metadata_from_onnx
    from dsa_export.sources import resolve

    manifest = read_manifest(args.artifact)
    os.environ.setdefault("DSA_EXPORT_ARTIFACT", str(manifest.folder))
    model = onnx.load(str(manifest.artifact(manifest.data["model"]["onnx"])), load_external_data=False)
    source = resolve(manifest.data["model"]["source"])
    reference = TorchRunner(source.module.float(), metadata_from_onnx(model), [o.name for o in manifest.outputs],
                            name="torch", input_order=source.input_names)
    runner = SessionRunner(manifest.folder, runtime=args.runtime, name=f"dsa-{args.runtime}")
    results = Comparator.run([reference, runner], data_loader=list(_data_loader().load_data()))
    compare = SimpleCompareFunc(atol=args.atol, rtol=args.rtol, check_error_stat=args.check_error_stat)
    return 0 if bool(Comparator.compare_accuracy(results, compare_func=compare)) else 1


if __name__ == "__main__":
    sys.exit(main())
