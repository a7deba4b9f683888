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
