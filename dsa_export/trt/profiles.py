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
            # 0 is a valid size for cache lengths: the first decode step has no past, and a prefill
            # profile fixes past_sequence at 0 (0/0/0).
            if not 0 <= lo <= opt <= hi:
                raise DSAUserError(
                    f"the shape range of '{name}' must satisfy 0 <= min <= opt <= max; got {lo}/{opt}/{hi}."
                )

    def describe(self) -> str:
        """``batch 1..4, sequence 1..512``: the ranges as a message shows them."""
        return ", ".join(f"{name} {lo}..{hi}" for name, (lo, _opt, hi) in self.dims.items())


DEFAULT_RANGE = ShapeRange({"batch": (1, 1, 4), "sequence": (1, 128, 512)})


def profile_ranges(ranges: ShapeRange, profiles: tuple[ShapeRange, ...] = ()) -> tuple[ShapeRange, ...]:
    """The optimization profiles of a build, in order: ``profiles`` when given, else ``ranges`` alone."""
    return tuple(profiles) or (ranges,)


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


def add_profiles(
    builder, config, model: onnx.ModelProto, ranges: tuple[ShapeRange, ...], runtime: str, path
) -> list[dict]:
    """One TensorRT(-RTX) optimization profile per ShapeRange, in order; returns their input shapes.

    ``IBuilderConfig.add_optimization_profile`` returns the new profile's index, or -1 when TensorRT
    finds the profile invalid; that is refused here instead of building an engine without it.
    """
    shapes = []
    for index, shape_range in enumerate(ranges):
        inputs = input_profiles(model, shape_range)
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in inputs.items():
            profile.set_shape(name, lo, opt, hi)
        added = config.add_optimization_profile(profile)
        if isinstance(added, bool) or not isinstance(added, int) or added != index:
            raise DSAUserError(
                f"{runtime} refused optimization profile {index} ({shape_range.describe()}) of '{path}' "
                f"(add_optimization_profile returned {added!r}); give min <= opt <= max shapes that the model accepts."
            )
        shapes.append(inputs)
    return shapes
