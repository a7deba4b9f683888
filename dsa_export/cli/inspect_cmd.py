"""``dsa-export inspect``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import click

from dsa_export.cli.options import check_outputs, emit_report, json_options


def _dims(value) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def describe(path: Path) -> dict:
    """A JSON-able summary of an ONNX file: ops, custom nodes, I/O, functions, metadata."""
    from onnx import helper

    from dsa_export.onnx_files import load_graph, metadata

    model = load_graph(path, "an .onnx file")
    graph = model.graph
    initializers = {i.name for i in graph.initializer}

    def io(values):
        return [{"name": v.name, "dtype": helper.tensor_dtype_to_string(v.type.tensor_type.elem_type).replace("TensorProto.", ""),
                 "shape": _dims(v)} for v in values if v.name not in initializers]

    value_types = {v.name: v for v in (*graph.value_info, *graph.output)}
    custom = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            out = value_types.get(node.output[0])
            custom.append({
                "name": node.name, "op": f"{node.domain}::{node.op_type}",
                "attributes": {a.name: helper.get_attribute_value(a) for a in node.attribute},
                "inputs": list(node.input), "outputs": list(node.output),
                "output_shape": _dims(out) if out is not None else None,
            })
    for entry in custom:
        entry["attributes"] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in entry["attributes"].items()}
    return {
        "file": str(path),
        "ir_version": model.ir_version,
        "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": io(graph.input),
        "outputs": io(graph.output),
        "op_counts": dict(sorted(Counter(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in graph.node).items())),
        "custom_nodes": custom,
        "functions": [f"{f.domain}::{f.name} ({len(f.node)} nodes)" for f in model.functions],
        "initializers": len(graph.initializer),
        "parameters": int(sum(_numel(i) for i in graph.initializer)),
        "metadata": metadata(model),
    }


def _numel(tensor) -> int:
    n = 1
    for d in tensor.dims:
        n *= d
    return n


@click.command(name="inspect")
@click.argument("file", type=click.Path(path_type=Path))
@json_options
def command(file: Path, as_json: bool, json_out: Path | None) -> None:
    """Show the ops, custom nodes and their attributes, I/O shapes and metadata of FILE."""
    check_outputs((json_out, "--json-out"), inputs=(file,))
    info = describe(file)
    emit_report(json.dumps(info, indent=2, default=str), as_json, json_out)
    if as_json:
        return
    click.echo(f"{info['file']}: IR {info['ir_version']}, opsets {info['opsets']}, producer {info['producer']}")
    for kind in ("inputs", "outputs"):
        click.echo(f"{kind}:")
        for v in info[kind]:
            click.echo(f"  {v['name']}: {v['dtype']} {v['shape']}")
    click.echo(f"nodes: {sum(info['op_counts'].values())} ({len(info['op_counts'])} op types), "
               f"{info['initializers']} initializers, {info['parameters']:,} parameters")
    click.echo("  " + ", ".join(f"{k} x{v}" for k, v in info["op_counts"].items()))
    click.echo(f"custom nodes: {len(info['custom_nodes'])}")
    for node in info["custom_nodes"]:
        attrs = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in node["attributes"].items())
        click.echo(f"  {node['name'] or '(unnamed)'}: {node['op']} ({attrs}) -> {node['output_shape']}")
    click.echo("functions: " + (", ".join(info["functions"]) or "none"))
    click.echo("metadata:")
    for key, value in info["metadata"].items():
        click.echo(f"  {key}: {value if len(value) < 120 else value[:117] + '...'}")
