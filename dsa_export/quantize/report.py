"""Accuracy of a Q/DQ model against the fp32 model it came from, on held-out inputs.

Per model output: cosine similarity and SQNR (signal-to-quantization-noise ratio, dB) over all
held-out inputs together. Per DSA layer: the overlap of the top-k selection, because the sparse
pattern is load-bearing (a key the quantized indexer drops is invisible to the attention). Per MoE
layer: the router's top-k agreement, the share of tokens whose set of selected experts is the
float model's (a token sent to another expert gets another function). The ``DSAIndexerTopK``
outputs and the experts nodes' ``topk_ids`` inputs are exposed as extra graph outputs in temporary
copies of both files.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx

from dsa_export.ops.contract import DOMAIN, MOE_EXPERTS, MOE_EXPERTS_FP8, SELECTING_OPS


@dataclass(frozen=True)
class Thresholds:
    """Pass marks (documented in docs/quantize.md)."""

    cosine: float = 0.99
    sqnr_db: float = 15.0
    topk_overlap: float = 0.95
    router_agreement: float = 0.9


@dataclass
class OutputAccuracy:
    output: str
    cosine: float
    sqnr_db: float
    max_abs: float
    passed: bool


@dataclass
class TopkOverlap:
    layer: int
    node: str
    overlap: float  # mean over rows of |selected_q & selected_fp32| / |selected_fp32|
    worst_row: float
    rows: int
    passed: bool


@dataclass
class RouterAgreement:
    layer: int
    node: str
    agreement: float  # share of token rows whose selected expert set equals the fp32 model's
    overlap: float  # mean over rows of |experts_q & experts_fp32| / |experts_fp32|
    rows: int
    passed: bool


@dataclass
class AccuracyReport:
    model: str
    precision: str
    method: str
    calibration_samples: int
    eval_inputs: list[str]
    thresholds: Thresholds
    outputs: list[OutputAccuracy] = field(default_factory=list)
    topk: list[TopkOverlap] = field(default_factory=list)
    router: list[RouterAgreement] = field(default_factory=list)
    passed: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=_json_float)

    def table(self) -> str:
        t = self.thresholds
        lines = [
            f"Accuracy of {self.precision} Q/DQ ({self.method}, {self.calibration_samples} calibration samples) "
            f"vs the unquantized model on {len(self.eval_inputs)} held-out inputs",
            f"{'output':<24} {'cosine':>9} {'SQNR dB':>9} {'max_abs':>10}  result",
        ]
        for o in self.outputs:
            lines.append(f"{o.output:<24} {o.cosine:>9.5f} {o.sqnr_db:>9.2f} {o.max_abs:>10.3e}  {'PASS' if o.passed else 'FAIL'}")
        if self.topk:
            lines.append(f"{'DSA layer (indexer node)':<34} {'top-k overlap':>13} {'worst row':>10} {'rows':>6}  result")
            for k in self.topk:
                label = f"{k.layer} ({k.node})"
                lines.append(f"{label:<34} {k.overlap:>13.4f} {k.worst_row:>10.4f} {k.rows:>6}  {'PASS' if k.passed else 'FAIL'}")
        if self.router:
            header = f"{'MoE layer (experts node)':<34} {'router agreement':>16} {'overlap':>8} {'rows':>6}  result"
            lines.append(header)
            for r in self.router:
                label = f"{r.layer} ({r.node})"
                verdict = "PASS" if r.passed else "FAIL"
                lines.append(f"{label:<34} {r.agreement:>16.4f} {r.overlap:>8.4f} {r.rows:>6}  {verdict}")
        verdict = "PASSED" if self.passed else "FAILED"
        marks = f"cosine >= {t.cosine:g}, SQNR >= {t.sqnr_db:g} dB"
        marks += f", top-k overlap >= {t.topk_overlap:g}" if self.topk else " (no DSAIndexerTopK nodes: no top-k overlap)"
        if self.router:
            marks += f", router agreement >= {t.router_agreement:g}"
        lines.append(f"{verdict}: {marks}")
        return "\n".join(lines)


def _json_float(value):
    return float(value)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    if denom == 0:
        return 1.0 if np.array_equal(a, b) else 0.0
    return float(np.dot(a, b) / denom)


def sqnr_db(reference: np.ndarray, quantized: np.ndarray) -> float:
    reference = reference.astype(np.float64)
    noise = float(np.sum((reference - quantized.astype(np.float64)) ** 2))
    signal = float(np.sum(reference**2))
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def selection_overlap(reference: np.ndarray, quantized: np.ndarray, num_keys: int) -> np.ndarray:
    """Per row, the fraction of the reference's selected keys (entries != -1) the other also selects.

    Rows are compared as sets (order within a row is unspecified). Rows where the reference
    selects nothing are dropped.
    """
    ref = reference.reshape(-1, reference.shape[-1]).astype(np.int64)
    qnt = quantized.reshape(-1, quantized.shape[-1]).astype(np.int64)
    sentinel = num_keys  # -1 and out-of-range entries land in one dummy column
    ref = np.where((ref >= 0) & (ref < num_keys), ref, sentinel)
    qnt = np.where((qnt >= 0) & (qnt < num_keys), qnt, sentinel)
    ref_mask = np.zeros((ref.shape[0], num_keys + 1), dtype=bool)
    qnt_mask = np.zeros_like(ref_mask)
    np.put_along_axis(ref_mask, ref, True, axis=1)
    np.put_along_axis(qnt_mask, qnt, True, axis=1)
    ref_mask, qnt_mask = ref_mask[:, :num_keys], qnt_mask[:, :num_keys]
    selected = ref_mask.sum(axis=1)
    keep = selected > 0
    return (ref_mask & qnt_mask).sum(axis=1)[keep] / selected[keep]


def router_agreement(reference: np.ndarray, quantized: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Per token row: whether the selected expert sets are equal, and the share of the reference's
    experts the other also selects. Rows are sets (slot order is unspecified); ids outside
    ``[0, num_experts)`` (-1) are empty slots."""
    ref = reference.reshape(-1, reference.shape[-1]).astype(np.int64)
    qnt = quantized.reshape(-1, quantized.shape[-1]).astype(np.int64)
    ref_mask = np.zeros((ref.shape[0], num_experts + 1), dtype=bool)
    qnt_mask = np.zeros((qnt.shape[0], num_experts + 1), dtype=bool)
    np.put_along_axis(ref_mask, np.where((ref >= 0) & (ref < num_experts), ref, num_experts), True, axis=1)
    np.put_along_axis(qnt_mask, np.where((qnt >= 0) & (qnt < num_experts), qnt, num_experts), True, axis=1)
    ref_mask, qnt_mask = ref_mask[:, :num_experts], qnt_mask[:, :num_experts]
    equal = (ref_mask == qnt_mask).all(axis=1)
    selected = np.maximum(ref_mask.sum(axis=1), 1)
    return equal, (ref_mask & qnt_mask).sum(axis=1) / selected


def experts_nodes(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(node name, topk_ids input) of every routed-experts node (plain or FP8), in graph order."""
    return [
        (node.name or f"{node.op_type}_{i}", node.input[1])
        for i, node in enumerate(model.graph.node)
        if node.domain == DOMAIN and node.op_type in (MOE_EXPERTS.name, MOE_EXPERTS_FP8.name)
    ]


def indexer_nodes(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(node name, output name) of every indexer node (DSAIndexerTopK, and the paged graphs'
    DSAIndexerTopKPaged, whose selections are logical token positions too), in graph order."""
    return [
        (node.name or f"{node.op_type}_{i}", node.output[0])
        for i, node in enumerate(model.graph.node)
        if node.domain == DOMAIN and node.op_type in SELECTING_OPS
    ]


def with_indexer_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` that also returns every indexer's selected indices and every routed-experts
    node's ``topk_ids``."""
    out = copy.deepcopy(model)
    existing = {o.name for o in out.graph.output}
    value_infos = {v.name: v for v in out.graph.value_info}
    for _, name in indexer_nodes(out) + experts_nodes(out):
        if name in existing:
            continue
        if name in value_infos:
            out.graph.output.append(copy.deepcopy(value_infos[name]))
        else:
            out.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT32, None))
    return out


def _run_all(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], tmp: Path, tag: str) -> list[dict[str, np.ndarray]]:
    from dsa_export.runtime.onnxrt import session

    path = tmp / f"{tag}.onnx"
    # Weights past what one protobuf holds (2 GiB: a real-width layer) go to a file beside it.
    large = sum(len(t.raw_data) for t in model.graph.initializer) > (1 << 30)
    onnx.save(model, str(path), save_as_external_data=large, all_tensors_to_one_file=True,
              location=f"{tag}.onnx.data")
    sess = session(path)
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(names, feed))) for feed in feeds]


def accuracy_report(
    reference: onnx.ModelProto,
    quantized: onnx.ModelProto,
    feeds: list[dict[str, np.ndarray]],
    labels: list[str],
    *,
    model_name: str,
    precision: str,
    method: str,
    calibration_samples: int,
    thresholds: Thresholds = Thresholds(),
) -> AccuracyReport:
    """Run both models in ONNX Runtime on ``feeds`` and judge outputs and top-k selections."""
    outputs = [o.name for o in reference.graph.output]
    indexers = indexer_nodes(reference)
    moe_ref, moe_q = experts_nodes(reference), experts_nodes(quantized)
    if len(moe_ref) != len(moe_q):  # a bug in the rewrite, not in the user's file
        raise RuntimeError(f"the Q/DQ model has {len(moe_q)} routed-experts nodes, the model {len(moe_ref)}")
    with tempfile.TemporaryDirectory(prefix="dsa-report-") as tmp:
        ref_runs = _run_all(with_indexer_outputs(reference), feeds, Path(tmp), "reference")
        q_runs = _run_all(with_indexer_outputs(quantized), feeds, Path(tmp), "quantized")
    report = AccuracyReport(model=model_name, precision=precision, method=method,
                            calibration_samples=calibration_samples, eval_inputs=list(labels), thresholds=thresholds)
    for name in outputs:
        ref = np.concatenate([r[name].astype(np.float64).ravel() for r in ref_runs])
        qnt = np.concatenate([q[name].astype(np.float64).ravel() for q in q_runs])
        cos, sqnr = cosine(ref, qnt), sqnr_db(ref, qnt)
        report.outputs.append(OutputAccuracy(
            output=name, cosine=cos, sqnr_db=sqnr, max_abs=float(np.max(np.abs(ref - qnt))),
            passed=cos >= thresholds.cosine and sqnr >= thresholds.sqnr_db,
        ))
    for layer, (node, name) in enumerate(indexers):
        rows = []
        for r, q in zip(ref_runs, q_runs):
            num_keys = int(max(r[name].max(initial=-1), q[name].max(initial=-1)) + 1)
            rows.append(selection_overlap(r[name], q[name], num_keys))
        overlap = np.concatenate(rows) if rows else np.zeros(0)
        mean = float(overlap.mean()) if overlap.size else 1.0
        report.topk.append(TopkOverlap(
            layer=layer, node=node, overlap=mean, worst_row=float(overlap.min()) if overlap.size else 1.0,
            rows=int(overlap.size), passed=mean >= thresholds.topk_overlap,
        ))
    for layer, ((node, ref_name), (_, q_name)) in enumerate(zip(moe_ref, moe_q)):
        equal, overlap = [], []
        for r, q in zip(ref_runs, q_runs):
            num_experts = int(max(r[ref_name].max(initial=-1), q[q_name].max(initial=-1)) + 1)
            e, o = router_agreement(r[ref_name], q[q_name], num_experts)
            equal.append(e)
            overlap.append(o)
        same = np.concatenate(equal) if equal else np.zeros(0, bool)
        share = float(same.mean()) if same.size else 1.0
        report.router.append(RouterAgreement(
            layer=layer, node=node, agreement=share,
            overlap=float(np.concatenate(overlap).mean()) if same.size else 1.0, rows=int(same.size),
            passed=share >= thresholds.router_agreement,
        ))
    report.passed = (all(o.passed for o in report.outputs) and all(k.passed for k in report.topk)
                     and all(r.passed for r in report.router))
    return report

