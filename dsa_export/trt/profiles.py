"""Optimization profiles: min/opt/max shapes of each input from its symbolic ONNX dims."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from dsa_export.errors import DSAUserError


@dataclass(frozen=True)
class ShapeRange:
    """min/opt/max of each named symbolic dim, e.g. ``{"batch": (1, 1, 4), "sequence": (1, 128, 512)}``."""

    dims: dict[str, tuple[int, int, int]]

    def __post_init__(self) -> None:
        for name, (lo, opt, hi) in self.dims.items():
            # 0 is a valid minimum for cache lengths (the first decode step has no past).
            if not (0 <= lo <= opt <= hi and hi >= 1):
                raise DSAUserError(f"the shape range of '{name}' must satisfy 0 <= min <= opt <= max, max >= 1; got {lo}/{opt}/{hi}.")


DEFAULT_RANGE = ShapeRange({"batch": (1, 1, 4), "sequence": (1, 128, 512)})


def input_profiles(model: onnx.ModelProto, ranges: ShapeRange = DEFAULT_RANGE) -> dict[str, tuple[list[int], ...]]:
    """``{input: (min_shape, opt_shape, max_shape)}`` for every graph input of ``model``."""
    initializers = {i.name for i in model.graph.initializer}
    profiles = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shapes: tuple[list[int], list[int], list[int]] = ([], [], [])
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                for shape in shapes:
                    shape.append(dim.dim_value)
            elif dim.dim_param in ranges.dims:
                for shape, size in zip(shapes, ranges.dims[dim.dim_param]):
                    shape.append(size)
            else:
                raise DSAUserError(
                    f"input '{value.name}' has a dynamic dim '{dim.dim_param or '?'}' with no shape range; "
                    f"give one for it (known: {', '.join(ranges.dims)})."
                )
        profiles[value.name] = shapes
    return profiles
