"""``dsa-export validate``."""

from __future__ import annotations

from pathlib import Path

import click

from dsa_export.cli.options import INT_LIST


@click.command(name="validate")
@click.argument("onnx_file", type=click.Path(path_type=Path))
@click.option("--reference", default=None, help="MODEL spec of the torch reference (default: from the file's metadata).")
@click.option("--atol", type=click.FloatRange(min=0), default=None, help="Absolute tolerance (default per dtype; fp32: 1e-4).")
@click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Relative tolerance (default per dtype; fp32: 1e-4).")
@click.option("--error-stat", type=click.Choice(["elemwise", "max", "mean", "median"]), default=None,
              help="How errors are judged (default: elemwise for fp32, median for fp16/bf16).")
@click.option("--seq-lens", type=INT_LIST, default="16,64,256", show_default=True, help="Sequence lengths to compare at.")
@click.option("--batch", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(onnx_file: Path, reference: str | None, atol: float | None, rtol: float | None, error_stat: str | None,
            seq_lens: tuple[int, ...], batch: int, as_json: bool) -> None:
    """Compare ONNX Runtime on ONNX_FILE with the PyTorch reference (Polygraphy Comparator).

    The reference runs in fp32; fp16/bf16 files are judged on their median error by default.
    Exits 1 when any output differs beyond the tolerances.
    """
    from dsa_export.errors import DSAUserError
    from dsa_export.validate import ValidationSettings, validate_onnx

    settings = ValidationSettings(reference=reference, seq_lens=seq_lens, batch=batch, atol=atol, rtol=rtol,
                                  error_stat=error_stat)
    report = validate_onnx(onnx_file, settings)
    click.echo(report.to_json() if as_json else report.table())
    if not report.passed:
        worst = max(report.errors, key=lambda e: e.max_abs)
        raise DSAUserError(
            f"ONNX Runtime differs from torch beyond atol={report.atol:g}/rtol={report.rtol:g} "
            f"(worst: '{worst.output}' at seq_len {worst.seq_len}, max abs {worst.max_abs:.3e})."
        )
