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
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from dsa_export import __version__
from dsa_export.errors import DSAUserError
from dsa_export.export.settings import DTYPES, ExportSettings
from dsa_export.model_source import ModelSource
from dsa_export.onnx_files import (
    META_CONFIG,
    META_MODE,
    META_OPS,
    META_SETTINGS,
    META_SPEC,
    META_TOOL,
)
from dsa_export.ops.contract import BASE_OPSET, DOMAIN, DOMAIN_VERSION, OPS
from dsa_export.ops.onnx_ops import function_protos, register_schemas, translation_table

log = logging.getLogger(__name__)

BATCH_DIM, SEQ_DIM = "batch", "sequence"

# Metadata keys written into every exported file.


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


def _cast_inputs(inputs: dict, dtype, fixed: tuple[str, ...] = ()) -> dict:
    return {k: (v.to(dtype) if v.is_floating_point() and k not in fixed else v) for k, v in inputs.items()}


def _on_meta(module) -> bool:
    return any(p.device.type == "meta" for p in module.parameters())


def _linear_as_gemm() -> dict:
    """``aten.linear`` as Gemm(transB=1) on ``x`` viewed as 2-D.

    torch's own translation multiplies a 3-D input by ``Transpose(W)``, which the graph optimizer
    then folds into a transposed copy of every weight: for a streamed checkpoint that is a second
    in-memory copy of the largest tensors (the 1.85 GB embedding-sized ``lm_head``) and a file
    whose bytes no longer match the checkpoint's. Gemm reads ``[out, in]`` as stored; TensorRT and
    ONNX Runtime run it without a copy.
    """
    import onnxscript
    import torch

    op = onnxscript.opset18

    def linear(input, weight, bias=None):
        lead = op.Shape(input, start=0, end=-1)
        flat = op.Reshape(input, op.Concat(op.Constant(value_ints=[-1]), op.Shape(weight, start=1, end=2), axis=0))
        out = op.Gemm(flat, weight, bias, transB=1) if bias is not None else op.Gemm(flat, weight, transB=1)
        return op.Reshape(out, op.Concat(lead, op.Shape(weight, start=0, end=1), axis=0))

    return {torch.ops.aten.linear.default: linear}


def _run_torch_export(source: ModelSource, settings: ExportSettings):
    """torch.export + translation to ONNX, unoptimized (weights are bound before optimizing)."""
    import torch

    from dsa_export.ops.quant import translations as quant_translations

    dtype = getattr(torch, DTYPES[settings.dtype])
    module = source.module.to(dtype) if source.cast else source.module
    inputs = _cast_inputs(source.example_inputs, dtype, source.fixed_dtype_inputs)
    if _on_meta(module):
        # Weights without data: trace on the meta device too; the exporter never needs values.
        inputs = {k: v.to("meta") for k, v in inputs.items()}
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
                custom_translation_table={**translation_table(), **quant_translations(),
                                          **(_linear_as_gemm() if source.keep_weight_layout else {})},
                opset_version=settings.opset,
                dynamo=True,
                optimize=False,
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
        spec = OPS.get(node.op_type)
        if spec is None or spec.output_dims is None:
            raise RuntimeError(f"unknown {DOMAIN} op {node.op_type}")
        if spec.min_opset > BASE_OPSET:
            opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
            if opset < spec.min_opset:
                raise DSAUserError(f"{node.op_type} (FP8 experts) needs opset {spec.min_opset} or "
                                   f"higher, not {opset}; export with --opset {spec.min_opset}.")
        inputs = [_shape_dims(known[name]) if name in known else None for name in node.input]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        dims = spec.output_dims(inputs, attrs)
        source = spec.output_type_input  # None: one fixed type, e.g. "tensor(int32)"
        elem = (getattr(onnx.TensorProto, spec.outputs[0].types[0][len("tensor("):-1].upper()) if source is None
                else known[node.input[source]].type.tensor_type.elem_type)
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


def _set_metadata(model: onnx.ModelProto, source: ModelSource, settings: ExportSettings,
                  folder: Path | None) -> None:
    """Tool, versions of the ``dsa`` ops used, settings and the model reference (its path relative
    to ``folder``, where the file goes; absolute until :func:`save_model` knows the destination)."""
    used_ops = {n.op_type for n in model.graph.node if n.domain == DOMAIN} & set(OPS)
    reference = source.reference if folder is None else source.reference.relative_to(folder)
    props = {
        META_TOOL: __version__,
        META_OPS: json.dumps({name: DOMAIN_VERSION for name in sorted(used_ops)}),
        META_MODE: settings.ops,
        META_SPEC: reference.to_json(),
        META_SETTINGS: json.dumps(
            {"batch": settings.batch, "seq_len": settings.seq_len, "dtype": settings.dtype,
             "opset": settings.opset, "seed": settings.seed, "ops": settings.ops},
            sort_keys=True,
        ),
    }
    if source.config is not None:
        props[META_CONFIG] = json.dumps(source.config, sort_keys=True, default=str)
    for key, value in props.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    model.producer_name = "dsa-export"
    model.producer_version = __version__
    model.doc_string = f"Exported by dsa-export {__version__} from {source.spec} ({settings.ops} ops)."


def relocate_reference(model: onnx.ModelProto, source: Path, folder: Path) -> bool:
    """Re-base a reference path recorded relative to ``source`` (the file's folder) on ``folder``,
    where a copy of the file goes; returns whether there was one to move."""
    from dsa_export.model_ref import ModelReference

    moved = False
    for prop in model.metadata_props:
        if prop.key == META_SPEC and prop.value.lstrip().startswith("{"):
            reference = ModelReference.from_json(prop.value)
            if reference.relative:
                prop.value = reference.absolute(source).relative_to(folder).to_json()
                moved = True
    return moved


def _relocate_reference(model: onnx.ModelProto, folder: Path) -> None:
    """Make the recorded reference's path relative to ``folder`` (the file's final directory)."""
    from dsa_export.model_ref import ModelReference

    for prop in model.metadata_props:
        if prop.key == META_SPEC and prop.value.lstrip().startswith("{"):
            prop.value = ModelReference.from_json(prop.value).relative_to(folder).to_json()


def inline_custom_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """The ``native`` form: every ``dsa`` node replaced by its function body.

    The sparse attention is inlined in its ``static`` construction (all K slots per chunk), the one
    TensorRT(-RTX)'s parser builds and the one a ``plugin`` file carries too (our ONNX Runtime
    sessions swap the faster ``trimmed`` body into a plugin file's function; an inlined body
    cannot be swapped, so a native file runs the static one everywhere).
    """
    import onnx.inliner

    from dsa_export.ops.attention_onnx import use_attention_body

    use_attention_body(model, "static")
    inlined = onnx.inliner.inline_local_functions(model)
    del inlined.functions[:]
    kept = [o for o in inlined.opset_import if o.domain != DOMAIN]
    del inlined.opset_import[:]
    inlined.opset_import.extend(kept)
    return inlined


def _finish(model: onnx.ModelProto, source: ModelSource, settings: ExportSettings,
            folder: Path | None) -> onnx.ModelProto:
    """Custom-node types, function bodies, metadata and the ``native`` inlining of a traced graph."""
    _strip_debug_metadata(model)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    used = {n.op_type for n in model.graph.node if n.domain == DOMAIN}
    if used:
        annotate_custom_outputs(model)
        _name_unnamed_dims(model)
        # The bodies of the ops the graph uses (an FP8 experts body exists from opset 21 only).
        model.functions.extend(f for f in function_protos(settings.opset) if f.name in used)
    _set_metadata(model, source, settings, folder)
    if settings.ops == "native":
        model = inline_custom_ops(model)
    return model


def _trace(source: ModelSource, settings: ExportSettings, step=None):
    """The optimized ``onnx_ir`` model of ``source`` (weights bound, not yet read) and the
    settings with dtype and opset decided. ``step(text)`` is told when each phase starts."""
    import onnxscript.optimizer
    import onnxscript.rewriter.onnx_fusions

    from dsa_export.export.external import bind_sources

    step = step or (lambda text: None)
    settings = settings.resolved(source.dtype, source.min_opset)
    register_schemas()
    step("tracing with torch.export and translating to ONNX")
    program = _run_torch_export(source, settings)
    model = program.model
    bind_sources(model, source.weights)
    # What torch.onnx's optimize=True runs, except that FP8 block scales are not folded into their
    # per-row form: the file keeps the checkpoint's bytes, and the engine builder folds it.
    keep = _scale_expansions(model)
    step("optimizing the ONNX graph")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnxscript.optimizer.optimize_ir(model, should_fold=lambda node: False if node in keep else None)
        onnxscript.rewriter.onnx_fusions.fuse(model)
    return model, settings


def _scale_expansions(model) -> set:
    """Nodes between a ``*_scale_inv`` initializer and the DequantizeLinear that consumes it."""
    found: set = set()
    frontier = [v for name, v in model.graph.initializers.items() if name.endswith("_scale_inv")]
    while frontier:
        value = frontier.pop()
        for node, _index in value.uses():
            if node.op_type == "DequantizeLinear" or node in found:
                continue
            found.add(node)
            frontier.extend(node.outputs)
    return found


def export_model(source: ModelSource, settings: ExportSettings, *, step=None) -> onnx.ModelProto:
    """Trace ``source`` and return the finished, checked ONNX model, weights included (models under
    2 GB; larger ones are written by :func:`export_to_file`, which streams their weights).
    ``step(text)`` is told when each phase (trace, optimization) starts."""
    import onnx_ir as ir

    from dsa_export.export.external import initializer_bytes as ir_bytes
    from dsa_export.export.external import materialize_all

    ir_model, settings = _trace(source, settings, step)
    if ir_bytes(ir_model) >= EXTERNAL_DATA_BYTES:
        raise DSAUserError(f"{source.spec} has over 2 GB of weights, which one ONNX message cannot hold; export "
                           "it to a file (dsa-export export -o FILE), which writes them as external data.")
    materialize_all(ir_model)
    model = _finish(ir.serde.serialize_model(ir_model), source, settings, folder=None)
    _check(model)
    return model


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_to_file` wrote."""

    path: Path
    settings: ExportSettings
    dsa_nodes: int
    #: Bytes of weights in ``<name>.data`` (0 when the weights are inside the .onnx file).
    external_bytes: int
    #: Bytes of all initializers.
    weight_bytes: int
    #: sha256 of ``<name>.data`` (computed while writing; None without external data).
    data_sha256: str | None = None


def export_to_file(source: ModelSource, settings: ExportSettings, path: str | os.PathLike[str], *,
                   progress=None, external_data_bytes: int | None = None, step=None) -> ExportResult:
    """Trace ``source`` and write it to ``path`` atomically, weights streamed from their sources.

    Weights over ``external_data_bytes`` (default :data:`STREAM_EXTERNAL_BYTES`) go to
    ``<name>.data`` beside the file, one tensor block at a time: peak memory is about one layer's
    graph plus one block, never the model. ``progress(name, nbytes)`` is called per written tensor;
    ``step(text)`` when each phase (trace, optimization, writing) starts.
    """
    import shutil
    import tempfile

    import onnx_ir as ir

    from dsa_export.export.external import initializer_bytes as ir_bytes
    from dsa_export.export.external import materialize_all, write_external_data
    from dsa_export.fileio import atomic_output

    path = Path(path)
    limit = STREAM_EXTERNAL_BYTES if external_data_bytes is None else external_data_bytes
    ir_model, settings = _trace(source, settings, step)
    if step is not None:
        step(f"writing {path.name}")
    total = ir_bytes(ir_model)
    if total < limit:
        materialize_all(ir_model)
        model = _finish(ir.serde.serialize_model(ir_model), source, settings, folder=path.parent.resolve())
        _check(model)
        with atomic_output(path) as tmp:
            onnx.save_model(model, tmp)
        return ExportResult(path, settings, _count_dsa(model), 0, total)
    # Two files: write both under their final names in a hidden sibling folder, check them there,
    # then move the data first and the model last, so a reader never sees a model without its data.
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        data_name = path.name + ".data"
        written, digest = write_external_data(ir_model, staging / data_name, location=data_name, progress=progress)
        model = _finish(ir.serde.serialize_model(ir_model), source, settings, folder=path.parent.resolve())
        del ir_model
        onnx.save_model(model, staging / path.name)
        _check(str(staging / path.name))
        os.replace(staging / data_name, path.parent / data_name)
        os.replace(staging / path.name, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(path, settings, _count_dsa(model), written, total, digest)


def _count_dsa(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.domain == DOMAIN)


#: Past this many weight bytes a model is saved with external data (protobuf's 2 GB limit).
EXTERNAL_DATA_BYTES = 2**31 - 2**27
#: :func:`export_to_file` streams weights into external data past this many bytes: a one-file model
#: is built in memory (weights, then protobuf's copy, then its serialization), an external-data one
#: never holds more than a tensor block.
STREAM_EXTERNAL_BYTES = 256 << 20


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
    _relocate_reference(model, path.parent.resolve())
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
