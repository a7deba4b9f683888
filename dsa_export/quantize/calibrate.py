"""Calibration data (loading and checking it) and the calibrator that turns it into ranges.

Ranges come from ONNX Runtime's calibrators (``onnxruntime.quantization.calibrate``): MinMax,
Entropy (TensorRT's KL-divergence threshold search over a histogram) and Percentile. They run the
plugin-mode file itself on CPU, since ONNX Runtime executes the ``dsa`` nodes through their
function bodies, and observe exactly the tensors that will carry Q/DQ, so the names in the
ranges, the Q/DQ graph and the TensorRT cache all agree.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from dsa_export.errors import DSAUserError

METHODS = ("entropy", "percentile", "minmax")
Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype
    dims: tuple[int | str, ...]  # ints are fixed, strings symbolic


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    initializers = {i.name for i in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
        specs.append(InputSpec(value.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)), dims))
    return specs


def _load_file(path: Path, specs: list[InputSpec]) -> Feed:
    try:
        if path.suffix == ".npy":
            if len(specs) != 1:
                raise DSAUserError(
                    f"'{path}' is a .npy file, which holds one array, but the model has {len(specs)} inputs; "
                    "use .npz files keyed by input name."
                )
            return {specs[0].name: np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except DSAUserError:
        raise
    except Exception as exc:
        raise DSAUserError(f"cannot read calibration file '{path}' ({type(exc).__name__}: {exc}).") from exc


def _load_script(spec: str) -> Iterable[Feed]:
    """A Polygraphy data-loader script: ``file.py`` (function ``load_data``) or ``file.py:function``."""
    path_text, _, func = spec.partition(".py:") if ".py:" in spec else (spec[:-3], "", "")
    path = Path(path_text + ".py")
    func = func or "load_data"
    if not path.is_file():
        raise DSAUserError(f"data-loader script '{path}' does not exist.")
    module_spec = importlib.util.spec_from_file_location(f"dsa_export_data_loader_{abs(hash(path))}", path)
    if module_spec is None or module_spec.loader is None:
        raise DSAUserError(f"cannot import '{path}' as Python.")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
        loader = getattr(module, func, None)
        if not callable(loader):
            raise DSAUserError(f"'{path}' has no callable '{func}'; define {func}() yielding feed dicts.")
        return list(loader())
    except DSAUserError:
        raise
    except Exception as exc:
        raise DSAUserError(f"the data loader '{spec}' raised {type(exc).__name__}: {exc}.") from exc


def load_feeds(data: str | Path, specs: list[InputSpec]) -> tuple[list[Feed], list[str]]:
    """All feeds of a folder of .npz/.npy files (sorted by name) or of a data-loader script, with
    a label per feed for error messages."""
    text = str(data)
    if text.endswith(".py") or ".py:" in text:
        feeds = _load_script(text)
        return feeds, [f"{text}[{i}]" for i in range(len(feeds))]
    path = Path(data)
    if not path.exists():
        raise DSAUserError(f"calibration data '{path}' does not exist; pass a folder of .npz/.npy files or a .py data loader.")
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy"))
    if not files:
        raise DSAUserError(f"'{path}' holds no .npz or .npy files; put calibration inputs there or pass another --data.")
    return [_load_file(f, specs) for f in files], [str(f) for f in files]


def check_feeds(feeds: list[Feed], labels: list[str], specs: list[InputSpec]) -> None:
    """Refuse data the model cannot take: missing/extra names, wrong dtype or rank, a fixed dim
    that differs, symbolic dims that disagree within one feed, NaN/Inf, empty arrays."""
    if not feeds:
        raise DSAUserError("the calibration data holds no samples; give at least one.")
    expected = {s.name for s in specs}
    for feed, label in zip(feeds, labels):
        if not isinstance(feed, dict):
            raise DSAUserError(f"{label} is not a dict of input name -> array.")
        missing, extra = sorted(expected - set(feed)), sorted(set(feed) - expected)
        if missing or extra:
            raise DSAUserError(
                f"{label} has inputs {sorted(feed)} but the model takes {sorted(expected)}"
                f"{' (missing ' + ', '.join(missing) + ')' if missing else ''}"
                f"{' (unknown ' + ', '.join(extra) + ')' if extra else ''}."
            )
        symbols: dict[str, int] = {}
        for spec in specs:
            value = np.asarray(feed[spec.name])
            if value.dtype != spec.dtype:
                raise DSAUserError(f"'{spec.name}' in {label} is {value.dtype}, but the model takes {spec.dtype}.")
            if value.ndim != len(spec.dims):
                raise DSAUserError(
                    f"'{spec.name}' in {label} has shape {list(value.shape)}, but the model takes rank {len(spec.dims)} "
                    f"({list(spec.dims)})."
                )
            if value.size == 0:
                raise DSAUserError(f"'{spec.name}' in {label} is empty (shape {list(value.shape)}).")
            for axis, (size, dim) in enumerate(zip(value.shape, spec.dims)):
                if isinstance(dim, int) and dim > 0 and size != dim:
                    raise DSAUserError(f"'{spec.name}' in {label} has size {size} on axis {axis}, but the model fixes it to {dim}.")
                if isinstance(dim, str) and dim != "?":
                    if symbols.setdefault(dim, size) != size:
                        raise DSAUserError(
                            f"{label} gives '{dim}' two sizes ({symbols[dim]} and {size}); inputs of one sample must agree."
                        )
            if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
                raise DSAUserError(f"'{spec.name}' in {label} contains NaN or Inf; calibration data must be finite.")


class _OneFeed:
    """The ``CalibrationDataReader`` protocol over a single feed, so we can tick a progress bar."""

    def __init__(self, feed: Feed):
        self._feed: Feed | None = feed

    def get_next(self) -> Feed | None:
        feed, self._feed = self._feed, None
        return feed


def _calibrator(model_path: Path, augmented: Path, tensors: list[str], method: str, percentile: float, num_bins: int):
    from onnxruntime.quantization.calibrate import EntropyCalibrater, MinMaxCalibrater, PercentileCalibrater

    # The augmented copy of a model with external data keeps its weights outside the protobuf too
    # (a protobuf holds at most 2 GiB: a real-width layer's weights do not fit).
    external = any(t.data_location == onnx.TensorProto.EXTERNAL
                   for t in onnx.load(str(model_path), load_external_data=False).graph.initializer)
    common = {"augmented_model_path": str(augmented), "symmetric": True, "use_external_data_format": external}
    if method == "minmax":
        calibrator = MinMaxCalibrater(model_path, **common)
    elif method == "entropy":
        # 128 quantized bins: the INT8 half-range, as TensorRT's entropy calibrator uses.
        calibrator = EntropyCalibrater(model_path, num_bins=num_bins, num_quantized_bins=128, **common)
    elif method == "percentile":
        calibrator = PercentileCalibrater(model_path, num_bins=num_bins, percentile=percentile, **common)
    else:
        raise DSAUserError(f"calibration method '{method}' is unknown; use one of {', '.join(METHODS)}.")
    # The sparse-attention body our ONNX Runtime sessions run (the same values, faster).
    from dsa_export.ops.onnx_ops import use_onnxruntime_bodies

    use_onnxruntime_bodies(calibrator.model)
    wanted = set(tensors)
    select = calibrator.select_tensors_to_calibrate

    def select_ours(model):  # observe exactly the tensors that get Q/DQ (or are reported)
        _, value_infos = select(model)
        unknown = sorted(wanted - set(value_infos))
        if unknown:
            raise RuntimeError(f"no type information for tensors {unknown}")
        return set(wanted), value_infos

    calibrator.select_tensors_to_calibrate = select_ours
    calibrator.augment_graph()
    calibrator.create_inference_session()
    calibrator.infer_session = _Float32Outputs(calibrator.infer_session)
    return calibrator


class _Float32Outputs:
    """An InferenceSession whose fp16/bf16 outputs come back as float32: NumPy's histograms fail
    on fp16 ranges ("cannot create 2048 finite-sized bins"), so fp16 exports calibrate in fp32."""

    def __init__(self, session):
        self._session = session

    def __getattr__(self, name):
        return getattr(self._session, name)

    def run(self, output_names, feed, *args, **kwargs):
        outputs = self._session.run(output_names, feed, *args, **kwargs)
        return [o.astype(np.float32) if isinstance(o, np.ndarray) and o.dtype == np.float16 else o for o in outputs]


def collect_amax(
    model_path: str | Path,
    feeds: list[Feed],
    tensors: list[str],
    method: str = "entropy",
    percentile: float = 99.99,
    num_bins: int = 2048,
    progress: bool = False,
) -> dict[str, float]:
    """Symmetric range (amax) of each tensor in ``tensors`` over ``feeds``, by ``method``."""
    if not tensors:
        return {}
    if not 0 < percentile <= 100:
        raise DSAUserError(f"percentile {percentile} is outside (0, 100].")
    with tempfile.TemporaryDirectory(prefix="dsa-calib-") as tmp, contextlib.redirect_stdout(io.StringIO()):
        calibrator = _calibrator(Path(model_path), Path(tmp) / "augmented.onnx", tensors, method, percentile, num_bins)
        bar = _progress(len(feeds), progress)
        try:
            for feed in feeds:
                try:
                    calibrator.collect_data(_OneFeed(feed))
                except Exception as exc:
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise DSAUserError(f"ONNX Runtime failed on a calibration sample: {first}") from exc
                bar.update(1)
        finally:
            bar.close()
        ranges = _ranges(calibrator, tensors, method, progress)
    amax = {}
    for name in tensors:
        low, high = (np.asarray(v, dtype=np.float64).ravel() for v in ranges[name])
        value = float(max(np.abs(low).max(), np.abs(high).max()))
        if not math.isfinite(value):
            raise DSAUserError(f"the calibrated range of '{name}' is not finite; check the model and data for overflow.")
        amax[name] = value
    return amax


def _ranges(calibrator, tensors: list[str], method: str, progress: bool) -> dict[str, tuple]:
    """(low, high) per tensor. Histogram thresholds (the entropy search takes about a second per
    tensor) are computed one tensor at a time by ONNX Runtime's collector, so the bar can show them."""
    if method == "minmax":
        return {name: data.range_value for name, data in calibrator.compute_data().items()}
    collector = calibrator.collector
    histograms = collector.histogram_dict
    ranges = {}
    bar = _progress(len(tensors), progress, desc=f"{method} thresholds", unit="tensor")
    try:
        for name in tensors:
            collector.histogram_dict = {name: histograms[name]}
            low, high = collector.compute_collection_result()[name][:2]
            ranges[name] = (low, high)
            bar.update(1)
    finally:
        collector.histogram_dict = histograms
        bar.close()
    return ranges


def _progress(total: int, enabled: bool, desc: str = "calibrating", unit: str = "sample"):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr, leave=False)
