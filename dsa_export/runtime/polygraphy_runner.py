"""A Polygraphy runner over any :class:`dsa_export.runtime.Session`.

The Polygraphy CLI cannot build every runner our artifacts need: it has no TensorRT-RTX backend,
its ``--onnxrt`` cannot pass TensorRT execution-provider options (``trt_extra_plugin_lib_paths``),
``--pluginref`` has no reference for the ``dsa`` ops, and the torch reference is not a CLI runner.
This runner puts a loaded artifact into Polygraphy's ``Comparator`` from Python instead (see
``tools/polygraphy/compare.py`` and docs/polygraphy.md).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.datatype import DataType


class SessionRunner(BaseRunner):
    """``SessionRunner("out/demo")``: loads the artifact on ``activate()``, like Polygraphy's runners."""

    def __init__(self, artifact: str | Path, runtime: str = "auto", name: str | None = None, device: int = 0):
        super().__init__(name=name, prefix="dsa-session-runner")
        self.artifact = artifact
        self.runtime = runtime
        self.device = device
        self.session = None

    def activate_impl(self) -> None:
        from dsa_export.runtime import load

        self.session = load(self.artifact, runtime=self.runtime, device=self.device)

    def get_input_metadata_impl(self) -> TensorMetadata:
        import numpy as np

        meta = TensorMetadata()
        for spec in self.session.inputs:
            meta.add(spec.name, dtype=DataType.from_dtype(np.dtype(spec.dtype)), shape=list(spec.shape))
        return meta

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        outputs = self.session.run(dict(feed_dict))
        self.inference_time = time.perf_counter() - start
        return OrderedDict(outputs)

    def deactivate_impl(self) -> None:
        if self.session is not None:
            self.session.close()
        self.session = None
