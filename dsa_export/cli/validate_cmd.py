"""``dsa-export validate``."""

from __future__ import annotations

from pathlib import Path

import click

from dsa_export.cli.options import INT_LIST, check_outputs, emit_report


@click.command(name="validate")
@click.argument("onnx_file", type=click.Path(path_type=Path))
@click.option("--reference", default=None,
              help="MODEL of the torch reference (default: the one the file records, if it is a built-in model or a "
                   "checkpoint folder). A path/file.py:factory is Python code: it runs only when you pass it here.")
@click.option("--atol", type=click.FloatRange(min=0), default=None, help="Absolute tolerance (default per dtype; fp32: 1e-4).")
@click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Relative tolerance (default per dtype; fp32: 1e-4).")
@click.option("--error-stat", type=click.Choice(["elemwise", "max", "mean", "median"]), default=None,
              help="How errors are judged (default: elemwise for fp32, median for fp16/bf16).")
@click.option("--seq-lens", type=INT_LIST, default="16,64,256", show_default=True, help="Sequence lengths to compare at.")
@click.option("--batch", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--tie-rtol", type=click.FloatRange(min=0), default=None,
              help="Hugging Face models: a top-k difference whose keys score within this fraction of the row's "
                   "largest index score of the k-th score is a near-tie flip (default per dtype; fp32: 1e-4).")
@click.option("--no-verify", is_flag=True,
              help="Do not check a file of a build folder or pipeline against its recorded sha256 first.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout (nothing else goes there).")
@click.option("--json-out", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the report as JSON to this file (atomically).")
def command(onnx_file: Path, reference: str | None, atol: float | None, rtol: float | None, error_stat: str | None,
            seq_lens: tuple[int, ...], batch: int, tie_rtol: float | None, no_verify: bool, as_json: bool,
            json_out: Path | None) -> None:
    """Compare ONNX Runtime on ONNX_FILE with the PyTorch reference (Polygraphy Comparator).

    The reference runs in fp32; fp16/bf16 files are judged on their median error by default.
    For Hugging Face checkpoints the reference is transformers running the file's layers, and
    each indexer's selections are compared as well: near-tie flips at the k-th place are counted
    and their positions left out of the strict comparison, any other difference fails.
    Every sequence length's memory is estimated first and refused when it cannot fit.
    Exits 1 when any output differs beyond the tolerances.
    """
    from dsa_export.errors import DSAUserError
    from dsa_export.validate import ValidationSettings, validate_onnx

    check_outputs((json_out, "--json-out"), inputs=(onnx_file,))
    settings = ValidationSettings(reference=reference, seq_lens=seq_lens, batch=batch, atol=atol, rtol=rtol,
                                  error_stat=error_stat, tie_rtol=tie_rtol, verify=not no_verify)
    report = validate_onnx(onnx_file, settings)
    if not as_json:
        click.echo(report.table())
    emit_report(report.to_json(), as_json, json_out)
    if not report.passed and report.unexplained_selections:
        raise DSAUserError(
            f"{report.unexplained_selections} query row(s) selected keys that transformers' indexer did not, beyond "
            "near-ties at the k-th place (see the table); the indexer computes something else."
        )
    if (not report.passed and report.min_topk_overlap is not None
            and report.min_topk_overlap < settings.min_topk_overlap):
        raise DSAUserError(f"the top-k overlap with transformers' indexers is {report.min_topk_overlap:.4f}, below "
                           f"{settings.min_topk_overlap:g}.")
    if not report.passed:
        worst = max(report.errors, key=lambda e: e.max_abs)
        raise DSAUserError(
            f"ONNX Runtime differs from torch beyond atol={report.atol:g}/rtol={report.rtol:g} "
            f"(worst: '{worst.output}' at seq_len {worst.seq_len}, max abs {worst.max_abs:.3e})."
        )
