"""Calibration recipes: what to quantize, how to calibrate and how to judge, per model family.

A recipe is a JSON file in ``calibration/`` at the repository root (see calibration/README.md).
Every field is optional; :data:`DEFAULTS` fills the rest, and command-line options override both.
A recipe names the models it serves in ``match`` (reference specs recorded by ``export`` and/or
``model_type`` values of a Hugging Face config); ``calibrate`` picks the one matching the file's
metadata unless ``--recipe`` names one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from dsa_export.errors import DSAUserError
from dsa_export.quantize.calibrate import METHODS
from dsa_export.quantize.experts import EXPERT_MODES
from dsa_export.quantize.report import Thresholds

#: ``calibration/`` of a source checkout (the package sits next to it).
CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "calibration"
PRECISIONS = ("int8", "fp8")
FP8_ACTIVATIONS = ("static", "dynamic")
FP8_WEIGHTS = ("channel", "block")


@dataclass(frozen=True)
class EvalInputs:
    """Held-out inputs generated from the file's reference model when the data has none to spare."""

    batch: int = 2
    seq_lens: tuple[int, ...] = (48, 96, 160)
    seed: int = 1000


@dataclass(frozen=True)
class Recipe:
    """Attributes:
        name: file stem, or ``defaults``.
        precision: ``int8`` or ``fp8``.
        method: ``entropy`` (TensorRT's KL threshold), ``percentile`` or ``minmax``.
        percentile: for ``percentile``: the kept share of |x|, in percent.
        num_bins: histogram bins for entropy/percentile.
        samples: calibration samples taken from the data (the rest, up to ``eval_samples``, is held out).
        eval_samples: most held-out samples taken from the data for the report.
        op_types: ops whose inputs get Q/DQ.
        exclude: fnmatch patterns of nodes (names, outputs or weight names) kept in high precision.
        quantize_indexer: also put Q/DQ on the q and k inputs of every DSAIndexerTopK.
        keep_indexer_projections: keep the indexer's q/k projections (wq_b, wk) in high precision;
            they are small, and the top-k selection downstream of them is load-bearing.
        experts: the routed experts' weights: ``int8`` (per expert per output channel, Q/DQ on
            the stacks), ``fp8`` (the FP8 experts op, per expert block scales), ``keep`` (high
            precision); None follows ``precision``. See docs/quantize.md.
        expert_block_size: largest edge of an FP8 expert scale block (halved until it divides
            the hidden and intermediate sizes; 128 for DeepSeek-V3.2 and GLM-5).
        expert_scale_pow2: round FP8 expert scales up to a power of two, as DeepSeek's checkpoints
            store them (``scale_fmt: ue8m0``): a dequantized DeepSeek export then gets its FP8
            expert bytes back exactly.
        fp8_activations: how FP8 activations are scaled: ``static`` (one calibrated scale per
            tensor) or ``dynamic`` (one scale per token and ``activation_block`` channels, computed
            at run time, as DeepSeek's ``act_quant``; :mod:`.dynamic`). INT8 is always static.
        activation_block: channels per dynamic activation scale, at most.
        fp8_weights: ``channel`` (one scale per output channel) or ``block`` (one per
            ``weight_block_size`` square block, DeepSeek's weight format; needs dynamic activations).
        weight_block_size: edge of a weight scale block, at most.
        weight_scale_pow2: round weight block scales up to a power of two (``scale_fmt: ue8m0``):
            a dequantized FP8 checkpoint then gets its weight bytes back.
        indexer_hadamard: with dynamic activations and ``quantize_indexer``, rotate the indexer's q
            and k by a Hadamard matrix before quantizing them (DeepSeek-V3.2's indexer does).
        data: the bundled data folder, relative to the recipe (what ``--data builtin`` means).
        thresholds: pass marks of the accuracy report.
        eval_inputs: how held-out inputs are generated from the reference model.
        match: {"reference": [...], "model_type": [...]} of the models this recipe serves.
        path: where the recipe was read from.
    """

    name: str = "defaults"
    precision: str = "int8"
    method: str = "entropy"
    percentile: float = 99.99
    num_bins: int = 2048
    samples: int = 16
    eval_samples: int = 8
    op_types: tuple[str, ...] = ("MatMul", "Gemm")
    exclude: tuple[str, ...] = ()
    quantize_indexer: bool = False
    keep_indexer_projections: bool = False
    experts: str | None = None
    expert_block_size: int = 128
    expert_scale_pow2: bool = False
    fp8_activations: str = "static"
    activation_block: int = 128
    fp8_weights: str = "channel"
    weight_block_size: int = 128
    weight_scale_pow2: bool = False
    indexer_hadamard: bool = False
    data: str | None = None
    thresholds: Thresholds = Thresholds()
    eval_inputs: EvalInputs = EvalInputs()
    match: dict = field(default_factory=dict, compare=False)
    path: Path | None = None

    @property
    def experts_mode(self) -> str:
        """``int8``, ``fp8`` or ``keep``: what happens to the routed experts."""
        return self.experts or self.precision

    @property
    def dynamic(self) -> bool:
        """Whether activations get run-time per-token scales (FP8 with ``fp8_activations: dynamic``)."""
        return self.precision == "fp8" and self.fp8_activations == "dynamic"

    @property
    def data_dir(self) -> Path | None:
        if self.data is None:
            return None
        base = self.path.parent if self.path else CALIBRATION_DIR
        return (base / self.data).resolve()

    def check(self) -> Recipe:
        where = f"recipe '{self.path or self.name}'"
        if self.precision not in PRECISIONS:
            raise DSAUserError(f"{where}: precision '{self.precision}' is unknown; use {' or '.join(PRECISIONS)}.")
        if self.method not in METHODS:
            raise DSAUserError(f"{where}: method '{self.method}' is unknown; use one of {', '.join(METHODS)}.")
        if not 0 < self.percentile <= 100:
            raise DSAUserError(f"{where}: percentile {self.percentile} is outside (0, 100].")
        if self.experts is not None and self.experts not in EXPERT_MODES:
            raise DSAUserError(f"{where}: experts '{self.experts}' is unknown; use one of {', '.join(EXPERT_MODES)}.")
        if self.expert_block_size < 1:
            raise DSAUserError(f"{where}: expert_block_size must be at least 1.")
        if self.fp8_activations not in FP8_ACTIVATIONS:
            raise DSAUserError(f"{where}: fp8_activations '{self.fp8_activations}' is unknown; use "
                               f"{' or '.join(FP8_ACTIVATIONS)}.")
        if self.fp8_weights not in FP8_WEIGHTS:
            raise DSAUserError(f"{where}: fp8_weights '{self.fp8_weights}' is unknown; use {' or '.join(FP8_WEIGHTS)}.")
        if self.activation_block < 16 or self.weight_block_size < 16:
            raise DSAUserError(f"{where}: activation_block and weight_block_size must be at least 16.")
        if self.precision == "fp8" and self.fp8_weights == "block" and self.fp8_activations != "dynamic":
            raise DSAUserError(f"{where}: FP8 weights in blocks (fp8_weights 'block') come with dynamic activations; "
                               "set fp8_activations to 'dynamic' or fp8_weights to 'channel'.")
        if self.indexer_hadamard and not (self.precision == "fp8" and self.dynamic and self.quantize_indexer):
            raise DSAUserError(f"{where}: the indexer's Hadamard rotation applies to a quantized indexer with dynamic "
                               "FP8 activations; also set precision fp8, fp8_activations 'dynamic' and "
                               "quantize_indexer, or drop indexer_hadamard.")
        if self.samples < 1 or self.num_bins < 128 or self.eval_samples < 0:
            raise DSAUserError(f"{where}: samples must be >= 1, eval_samples >= 0 and num_bins >= 128.")
        return self


DEFAULTS = Recipe()


def _from_dict(data: dict, path: Path) -> Recipe:
    known = {f.name for f in fields(Recipe)} - {"name", "path"}
    unknown = sorted(set(data) - known - {"description"})
    if unknown:
        raise DSAUserError(f"recipe '{path}' has unknown field(s) {unknown}; known: {sorted(known)}.")
    values = {k: v for k, v in data.items() if k in known}
    try:
        if "thresholds" in values:
            values["thresholds"] = Thresholds(**values["thresholds"])
        if "eval_inputs" in values:
            ev = dict(values["eval_inputs"])
            if "seq_lens" in ev:
                ev["seq_lens"] = tuple(ev["seq_lens"])
            values["eval_inputs"] = EvalInputs(**ev)
    except TypeError as exc:
        raise DSAUserError(f"recipe '{path}': {exc}.") from None
    for key in ("op_types", "exclude"):
        if key in values:
            values[key] = tuple(values[key])
    return replace(DEFAULTS, name=path.stem, path=path, **values).check()


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    if not path.is_file():
        raise DSAUserError(f"recipe '{path}' does not exist.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DSAUserError(f"recipe '{path}' is not valid JSON ({exc.msg} at line {exc.lineno}).") from None
    if not isinstance(data, dict):
        raise DSAUserError(f"recipe '{path}' must be a JSON object.")
    return _from_dict(data, path)


def bundled_recipes() -> list[Recipe]:
    if not CALIBRATION_DIR.is_dir():
        return []
    return [load_recipe(p) for p in sorted(CALIBRATION_DIR.glob("*.json"))]


def find_recipe(reference: str | None, model_type: str | None) -> Recipe:
    """The bundled recipe serving this model, or :data:`DEFAULTS`."""
    for recipe in bundled_recipes():
        if reference and reference in recipe.match.get("reference", []):
            return recipe
        if model_type and model_type in recipe.match.get("model_type", []):
            return recipe
    return DEFAULTS
