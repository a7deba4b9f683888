"""``dsa-export run``."""

from __future__ import annotations

from pathlib import Path

import click

from dsa_export.runtime.session import RUNTIME_CHOICES


def _load_npz(path: Path) -> dict:
    import numpy as np

    from dsa_export.errors import DSAUserError

    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise DSAUserError(f"{path} is not a readable .npz file ({exc}).") from exc


def _parse_dims(text: str | None) -> dict[str, int]:
    from dsa_export.errors import DSAUsageError

    dims: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit() or int(value) < 1:
            raise DSAUsageError(f"--dims takes name=size pairs such as batch=2,sequence=64; got {text!r}.")
        dims[name.strip()] = int(value)
    return dims


@click.command(name="run")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--inputs", "inputs_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Inputs as .npz (one array per input name). Default: random inputs from the manifest.")
@click.option("--outputs", "outputs_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the outputs to this .npz (atomically).")
@click.option("--runtime", type=click.Choice(RUNTIME_CHOICES), default="auto", show_default=True,
              help="auto: the engine when it can run here, else the ONNX Runtime artifact.")
@click.option("--dims", default=None, metavar="DIM=N,...",
              help="Sizes of the dynamic dims of generated inputs (default: the profile's opt shape).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of generated inputs.")
@click.option("--save-inputs", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the inputs used to this .npz.")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True)
def command(artifact: Path, inputs_file: Path | None, outputs_file: Path | None, runtime: str, dims: str | None,
            seed: int, save_inputs: Path | None, device: int) -> None:
    """Run ARTIFACT (a build folder, an engine, a build's onnxruntime/ folder or an .onnx) once.

    Prints which runtime ran and the shape, dtype and statistics of every output.
    """
    import time

    import numpy as np

    from dsa_export.fileio import atomic_output
    from dsa_export.runtime import load

    session = load(artifact, runtime=runtime, device=device)
    click.echo(f"Runtime: {session.kind}")
    for note in session.notes:
        click.echo(f"  note: {note}")
    if inputs_file is not None:
        feeds = _load_npz(inputs_file)
        origin = str(inputs_file)
    else:
        feeds = session.example_inputs(seed=seed, dims=_parse_dims(dims))
        origin = f"generated from the manifest (seed {seed})" if session.manifest else f"generated (seed {seed})"
    for name, value in feeds.items():
        click.echo(f"  input  {name:<16} {str(list(value.shape)):<16} {value.dtype}  ({origin})")
    start = time.perf_counter()
    outputs = session.run(feeds)
    elapsed = time.perf_counter() - start
    for name, value in outputs.items():
        stats = ""
        if value.size and value.dtype.kind in "fiub":
            data = value.astype(np.float64)
            stats = f"min {data.min():.4g} max {data.max():.4g} mean {data.mean():.4g} std {data.std():.4g}"
        click.echo(f"  output {name:<16} {str(list(value.shape)):<16} {value.dtype}  {stats}")
    click.echo(f"Ran in {elapsed * 1000:.1f} ms.")
    for path, arrays in ((save_inputs, feeds), (outputs_file, outputs)):
        if path is not None:
            with atomic_output(path) as tmp:
                with open(tmp, "wb") as handle:
                    np.savez(handle, **arrays)
            click.echo(f"Wrote {path}.")
