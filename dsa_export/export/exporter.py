"""Export a torch model to ONNX with ``dsa`` custom nodes (or inline standard ops).

The torch exporter (dynamo) turns ``torch.ops.dsa.*`` into ``dsa``-domain nodes through our
translation table; this module then attaches the op function bodies, makes sure every custom
node output carries dtype and symbolic shape, writes metadata, optionally inlines everything for
``native`` mode, and checks the result with ``onnx.checker`` (full check).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import warnings
from pathlib import Path

import onnx
from onnx import helper

from dsa_export import __version__
from dsa_export.errors import DSAUserError
from dsa_export.export.settings import DTYPES, ExportSettings
from dsa_export.ops.contract import DOMAIN, DOMAIN_VERSION, OPS
from dsa_export.ops.onnx_ops import function_protos, register_schemas, translation_table
from dsa_export.sources import ModelSource

log = logging.getLogger(__name__)

BATCH_DIM, SEQ_DIM = "batch", "sequence"

# Metadata keys written into every exported file.
META_TOOL = "dsa_export.version"
META_OPS = "dsa_export.op_versions"
META_MODE = "dsa_export.ops_mode"
META_SPEC = "dsa_export.reference"
META_CONFIG = "dsa_export.model_config"
META_SETTINGS = "dsa_export.export_settings"
META_FILE_SHA = "dsa_export.reference_sha256"


def _dynamic_shapes(inputs: dict, axes: dict[str, dict[int, str]] | None = None) -> dict:
    """torch.export dims per input: the source's named axes, else batch on axis 0, sequence on 1."""
    import torch

    dims: dict[str, object] = {}

    def dim(name: str):
        return dims.setdefault(name, torch.export.Dim(name))

    shapes = {}
    for name, value in inputs.items():
        if axes is not None:
            shapes[name] = {axis: dim(label) for axis, label in axes.get(name, {}).items()}
            continue
        shapes[name] = {axis: dim(label) for axis, label in ((0, BATCH_DIM), (1, SEQ_DIM)) if value.dim() > axis}
    return shapes


def _cast_inputs(inputs: dict, dtype) -> dict:
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()}


def _run_torch_export(source: ModelSource, settings: ExportSettings):
    import torch

    dtype = getattr(torch, DTYPES[settings.dtype])
    module = source.module.to(dtype)
    inputs = _cast_inputs(source.example_inputs, dtype)
    shapes = _dynamic_shapes(inputs, source.dynamic_axes)
    if source.input_names is not None:  # a module taking its inputs positionally
        args, kwargs = tuple(inputs[n] for n in source.input_names), None
        # torch.export sees a ``forward(*args)`` signature as one tuple argument.
        shapes = (tuple(shapes[n] for n in source.input_names),)
    else:
        args, kwargs = (), inputs
    # The exporter prints progress and warnings of its own (torchvision absent, constant folding of
    # Split); route them to our log instead of the user's terminal.
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), torch.no_grad():
        warnings.simplefilter("ignore")
        for noisy in ("torch.onnx", "onnxscript", "onnx_ir"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        try:
            program = torch.onnx.export(
                module,
                args,
                kwargs=kwargs,
                dynamic_shapes=shapes,
                input_names=source.input_names,
                custom_translation_table=translation_table(),
                opset_version=settings.opset,
                dynamo=True,
                optimize=True,
                output_names=source.output_names,
                verbose=False,
            )
        except Exception as exc:
            raise DSAUserError(
                f"torch.onnx could not export the model ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                "run with --debug for the exporter's full message."
            ) from exc
    log.debug("exporter output:\n%s", sink.getvalue())
    return program


def _shape_dims(value_info: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def annotate_custom_outputs(model: onnx.ModelProto) -> None:
    """Write dtype + shape of every custom node output into ``graph.value_info``.

    The shapes follow the op contract and reuse the symbolic dims of the node's inputs, so they
    stay symbolic in batch and sequence.
    """
    graph = model.graph
    known = {vi.name: vi for vi in (*graph.input, *graph.value_info, *graph.output)}
    for node in graph.node:
        if node.domain != DOMAIN:
            continue
        q = known.get(node.input[0])
        if q is None or not q.type.tensor_type.shape.dim:
            raise RuntimeError(f"no shape for the q input of {node.op_type} node {node.name!r}")
        qd = _shape_dims(q)
        if node.op_type == "DSAIndexerTopK":
            topk = next(a.i for a in node.attribute if a.name == "topk")
            dims, elem = [qd[0], qd[1], topk], onnx.TensorProto.INT32
        elif node.op_type == "DSASparseAttention":
            v = known[node.input[2]]
            dims, elem = [qd[0], qd[1], qd[2], _shape_dims(v)[3]], q.type.tensor_type.elem_type
        elif node.op_type in ("DSAMoEExperts", "DSAMoEExpertsFP8"):
            opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
            if opset < OPS[node.op_type].min_opset:
                raise DSAUserError(f"{node.op_type} (FP8 experts) needs opset {OPS[node.op_type].min_opset} or "
                                   f"higher, not {opset}; export with --opset {OPS[node.op_type].min_opset}.")
            dims, elem = qd, q.type.tensor_type.elem_type  # out: x's shape and dtype
        else:
            raise RuntimeError(f"unknown {DOMAIN} op {node.op_type}")
        info = helper.make_tensor_value_info(node.output[0], elem, dims)
        existing = known.get(node.output[0])
        if existing is not None and existing in graph.value_info:
            existing.CopyFrom(info)
        elif existing is None:
            graph.value_info.append(info)
            known[info.name] = graph.value_info[-1]


def _name_unnamed_dims(model: onnx.ModelProto) -> None:
    """Give the exporter's anonymous dim of each indexer's ``lengths`` input the batch name."""
    lengths = {n.input[3] for n in model.graph.node if n.domain == DOMAIN and n.op_type == "DSAIndexerTopK"
               and len(n.input) > 3}
    for vi in model.graph.value_info:
        dims = vi.type.tensor_type.shape.dim
        if vi.name in lengths and len(dims) == 1 and not dims[0].dim_param and not dims[0].HasField("dim_value"):
            dims[0].dim_param = BATCH_DIM


def _strip_debug_metadata(model: onnx.ModelProto) -> None:
    """Drop per-node/per-value exporter metadata (stack traces, original FX names)."""
    for node in model.graph.node:
        del node.metadata_props[:]
    for vi in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        del vi.metadata_props[:]
    for init in model.graph.initializer:
        del init.metadata_props[:]
    del model.metadata_props[:]


def _set_metadata(model: onnx.ModelProto, source: ModelSource, settings: ExportSettings) -> None:
    props = {
        META_TOOL: __version__,
        META_OPS: json.dumps({name: DOMAIN_VERSION for name in sorted(OPS)}),
        META_MODE: settings.ops,
        META_SPEC: source.spec,
        META_SETTINGS: json.dumps(
            {"batch": settings.batch, "seq_len": settings.seq_len, "dtype": settings.dtype,
             "opset": settings.opset, "seed": settings.seed, "ops": settings.ops},
            sort_keys=True,
        ),
    }
    if source.config is not None:
        props[META_CONFIG] = json.dumps(source.config, sort_keys=True, default=str)
    if source.file_sha256:
        props[META_FILE_SHA] = source.file_sha256
    for key, value in props.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    model.producer_name = "dsa-export"
    model.producer_version = __version__
    model.doc_string = f"Exported by dsa-export {__version__} from {source.spec} ({settings.ops} ops)."


def inline_custom_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """The ``native`` form: every ``dsa`` node replaced by its function body."""
    import onnx.inliner

    inlined = onnx.inliner.inline_local_functions(model)
    del inlined.functions[:]
    kept = [o for o in inlined.opset_import if o.domain != DOMAIN]
    del inlined.opset_import[:]
    inlined.opset_import.extend(kept)
    return inlined


def export_model(source: ModelSource, settings: ExportSettings) -> onnx.ModelProto:
    """Trace ``source`` and return the finished, checked ONNX model."""
    register_schemas()
    program = _run_torch_export(source, settings)
    model = program.model_proto
    _strip_debug_metadata(model)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    if any(n.domain == DOMAIN for n in model.graph.node):
        annotate_custom_outputs(model)
        _name_unnamed_dims(model)
        model.functions.extend(function_protos(settings.opset))
    _set_metadata(model, source, settings)
    if settings.ops == "native":
        model = inline_custom_ops(model)
    if initializer_bytes(model) < EXTERNAL_DATA_BYTES:
        _check(model)
    # else: protobuf cannot serialize it in one piece; save_model checks the saved file instead.
    return model


#: Past this many weight bytes a model is saved with external data (protobuf's 2 GB limit).
EXTERNAL_DATA_BYTES = 2**31 - 2**27


def initializer_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for tensor in model.graph.initializer:
        if tensor.raw_data:
            total += len(tensor.raw_data)
        else:
            n = 1
            for d in tensor.dims:
                n *= d
            total += n * 4
    return total


def _check(model: onnx.ModelProto | str) -> None:
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise RuntimeError(f"the exported model fails onnx.checker: {exc}") from exc


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str], *,
               external_data_bytes: int = EXTERNAL_DATA_BYTES) -> Path:
    """Write ``model`` atomically; its weights go to ``<name>.data`` beside it when they exceed
    ``external_data_bytes`` (protobuf cannot hold more than 2 GB in one message). In that case the
    model's tensors are turned into external references in place, as ``onnx.save_model`` does."""
    import shutil
    import tempfile

    from dsa_export.fileio import atomic_output

    path = Path(path)
    if initializer_bytes(model) < external_data_bytes:
        with atomic_output(path) as tmp:
            onnx.save_model(model, tmp)
        return path
    # Two files: write both under their final names in a hidden sibling folder, check them there,
    # then move the data first and the model last, so a reader never sees a model without its data.
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        data_name = path.name + ".data"
        onnx.save_model(model, staging / path.name, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
        _check(str(staging / path.name))
        os.replace(staging / data_name, path.parent / data_name)
        os.replace(staging / path.name, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
