"""A small builder for the standard-op graphs of the ``dsa`` function bodies (and their subgraphs).

Value and node names are derived from a prefix and a counter, so a body is byte-identical on every
export, and subgraphs (``Loop``/``Scan``/``If`` bodies) get prefixes of their own: ONNX forbids a
subgraph to reuse a name of an enclosing scope.
"""

from __future__ import annotations

import onnx
from onnx import AttributeProto, TensorProto, helper


class Body:
    """Collects nodes; ``b("Op", *inputs, attr=value)`` appends a node and returns its output name(s)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self._n = 0
        self._children = 0

    def __call__(self, op_type: str, *inputs: str, outputs: int = 1, **attrs) -> str | list[str]:
        names = [f"{self.prefix}_{self._n}_{i}" for i in range(outputs)]
        self._n += 1
        node = helper.make_node(op_type, list(inputs), names, name=f"{self.prefix}/{op_type}_{self._n - 1}")
        for key, value in attrs.items():
            if isinstance(value, AttributeProto):
                value.name = key
                node.attribute.append(value)
            else:
                node.attribute.append(helper.make_attribute(key, value))
        self.nodes.append(node)
        return names[0] if outputs == 1 else names

    def const(self, value, dtype=TensorProto.INT64) -> str:
        values = value if isinstance(value, (list, tuple)) else [value]
        dims = [len(values)] if isinstance(value, (list, tuple)) else []
        return self("Constant", value=helper.make_tensor("v", dtype, dims, values))

    def ref(self, attr: str, kind: int) -> str:
        """A Constant whose value is the function attribute ``attr`` (``ref_attr_name``)."""
        field = {AttributeProto.INT: "value_int", AttributeProto.FLOAT: "value_float"}[kind]
        proto = AttributeProto(name=field, ref_attr_name=attr, type=kind)
        return self("Constant", **{field: proto})

    def true(self) -> str:
        """A scalar bool Constant True: the ``cond`` output of a Loop body.

        Our Loops have a trip count and no termination condition (an empty ``cond`` input):
        TensorRT's parser warns about a Loop with both, and when the Loop has no ``cond`` it does
        not bind the body's ``cond`` input, so a body that passes that input through (``Identity``)
        fails to parse ("Node input was not registered"). ONNX Runtime and ``onnx.checker`` take
        both forms, with the same results; onnx 1.23's ``onnx.reference`` runs no iteration of a
        Loop without ``cond``, which :class:`dsa_export.ops.reference.Loop` corrects.
        """
        return self("Constant", value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))

    def rename_last(self, name: str) -> None:
        self.nodes[-1].output[0] = name

    def child(self, tag: str) -> Body:
        """A builder for a subgraph of this body, with names that cannot clash with this scope."""
        self._children += 1
        return Body(f"{self.prefix}_{tag}{self._children}")

    def graph(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]) -> onnx.GraphProto:
        """This body as a subgraph (ONNX Runtime's Scan wants every output's rank declared)."""
        return helper.make_graph(self.nodes, self.prefix, inputs, outputs)


def value(name: str, elem_type: int, rank: int | None = None) -> onnx.ValueInfoProto:
    """A subgraph input of known type; a scalar when ``rank`` is 0, unknown shape when None."""
    return helper.make_tensor_value_info(name, elem_type, None if rank is None else [None] * rank if rank else [])


def replace_function(model: onnx.ModelProto, domain: str, name: str, build) -> bool:
    """Replace, in place, ``model``'s local function ``domain::name`` by ``build(opset)`` (opset: the
    model's standard-domain version), so a file can carry one construction of a body and a
    runtime another; returns whether the model had the function."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    for i, fn in enumerate(model.functions):
        if fn.domain == domain and fn.name == name:
            model.functions[i].CopyFrom(build(opset))
            return True
    return False
