"""``dsa-export run``."""

from __future__ import annotations

from pathlib import Path

import click

from dsa_export.cli.options import DIM_SIZES, check_outputs, emit_report, json_options, say
from dsa_export.runtime.session import RUNTIME_CHOICES


def _load_npz(path: Path) -> dict:
    import zipfile

    import numpy as np

    from dsa_export.errors import DSAUserError

    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DSAUserError(f"{path} is not a readable .npz file ({type(exc).__name__}); pass one written by "
                           "numpy.savez.") from exc
    if not hasattr(data, "files"):
        raise DSAUserError(f"{path} holds one array, not named arrays; save the inputs with numpy.savez(name=array).")
    try:
        with data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DSAUserError(f"{path} is not a readable .npz file ({type(exc).__name__}); pass one written by "
                           "numpy.savez.") from exc


def _require_sizes(session, artifact: Path, dims: dict) -> None:
    """Inputs are generated at the sizes ``--dims`` gives, else at the build's opt shape: a plain
    .onnx has no build, so say which sizes to pass instead of failing on the first one."""
    if getattr(session, "manifest", None) is not None or not hasattr(session, "dim_names"):
        return
    from dsa_export.stages.session import PipelineSession

    if isinstance(session, PipelineSession):  # a pipeline sizes its prefill call itself
        return
    missing = sorted(session.dim_names() - set(dims))
    if missing:
        from dsa_export.errors import DSAUsageError

        example = ",".join(f"{name}={dims.get(name, 1 if name == 'batch' else 16)}"
                           for name in sorted(session.dim_names()))
        raise DSAUsageError(
            f"{artifact} has no build around it (no manifest.json) to size generated inputs from; give the size of "
            f"its dynamic dim(s) {', '.join(missing)} with --dims (e.g. --dims {example}), or the inputs themselves "
            "with --inputs FILE.npz."
        )


@click.command(name="run")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--inputs", "inputs_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Inputs as .npz (one array per input name). Default: random inputs from the manifest.")
@click.option("--outputs", "outputs_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the outputs to this .npz (atomically).")
@click.option("--runtime", type=click.Choice(RUNTIME_CHOICES), default="auto", show_default=True,
              help="auto: the engine when it can run here, else the ONNX Runtime artifact.")
@click.option("--dims", type=DIM_SIZES, default=None, metavar="DIM=N,...",
              help="Sizes of the dynamic dims of generated inputs (default: the profile's opt shape).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of generated inputs.")
@click.option("--save-inputs", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the inputs used to this .npz.")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--no-verify", is_flag=True,
              help="Load the build's files without checking them against the sizes and sha256 in manifest.json.")
@json_options
def command(artifact: Path, inputs_file: Path | None, outputs_file: Path | None, runtime: str, dims: dict | None,
            seed: int, save_inputs: Path | None, device: int, no_verify: bool, as_json: bool,
            json_out: Path | None) -> None:
    """Run ARTIFACT (a build folder, an engine, a build's onnxruntime/ folder, an .onnx, or a pipeline
    folder of stages) once.

    Prints which runtime ran and the shape, dtype and statistics of every output. Every file
    loaded from a build folder is first checked against its manifest (size and sha256, hashed once
    and cached in the folder); inputs must fit the build's optimization profile, types and token
    range; shapes whose run cannot fit in memory are refused before they run.
    """
    import time

    import numpy as np

    from dsa_export.errors import DSAUsageError
    from dsa_export.runtime import load

    check_outputs((outputs_file, "--outputs"), (save_inputs, "--save-inputs"), (json_out, "--json-out"),
                  inputs=(inputs_file, artifact))
    if inputs_file is not None and dims:
        raise DSAUsageError("--dims sizes generated inputs; drop it when --inputs gives them.")
    session = load(artifact, runtime=runtime, device=device, verify=not no_verify)
    say(f"Runtime: {session.kind}", as_json)
    for note in session.notes:
        say(f"  note: {note}", as_json)
    if inputs_file is not None:
        feeds = _load_npz(inputs_file)
        origin = str(inputs_file)
    else:
        _require_sizes(session, artifact, dims or {})
        feeds = session.example_inputs(seed=seed, dims=dims or {})
        origin = f"generated from the manifest (seed {seed})" if session.manifest else f"generated (seed {seed})"
    report: dict = {"artifact": str(artifact), "runtime": session.kind, "notes": list(session.notes),
                    "inputs": [], "outputs": [], "written": []}
    for name, value in feeds.items():
        say(f"  input  {name:<16} {str(list(value.shape)):<16} {value.dtype}  ({origin})", as_json)
        report["inputs"].append({"name": name, "shape": list(value.shape), "dtype": str(value.dtype), "origin": origin})
    start = time.perf_counter()
    outputs = session.run(feeds)
    elapsed = time.perf_counter() - start
    for name, value in outputs.items():
        stats, numbers = "", {}
        if value.size and value.dtype.kind in "fiub":
            data = value.astype(np.float64)
            numbers = {"min": float(data.min()), "max": float(data.max()), "mean": float(data.mean()),
                       "std": float(data.std())}
            stats = " ".join(f"{key} {number:.4g}" for key, number in numbers.items())
        say(f"  output {name:<16} {str(list(value.shape)):<16} {value.dtype}  {stats}", as_json)
        report["outputs"].append({"name": name, "shape": list(value.shape), "dtype": str(value.dtype), **numbers})
    say(f"Ran in {elapsed * 1000:.1f} ms.", as_json)
    report["milliseconds"] = round(elapsed * 1000, 3)
    from dsa_export.fileio import atomic_output

    for path, arrays in ((save_inputs, feeds), (outputs_file, outputs)):
        if path is not None:
            with atomic_output(path) as tmp:
                with open(tmp, "wb") as handle:
                    np.savez(handle, **arrays)
            say(f"Wrote {path}.", as_json)
            report["written"].append(str(path))
    emit_report(report, as_json, json_out)
