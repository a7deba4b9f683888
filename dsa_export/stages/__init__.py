"""A model cut into pipeline-parallel stages: contiguous layer ranges, one graph and one engine per GPU.

- :mod:`~dsa_export.stages.plan`: how many stages and which layers each holds (from ``config.json``
  and the shard headers alone).
- :mod:`~dsa_export.stages.export`: one ONNX file per stage and ``pipeline.json`` (resumable).
- :mod:`~dsa_export.stages.calibration`: the calibration set run stage by stage, each stage's inputs
  on disk, for INT8/FP8 stage builds.
- :mod:`~dsa_export.stages.builder`: one build folder per stage (the ordinary build of
  :mod:`dsa_export.artifact` on each stage's graph).
- :mod:`~dsa_export.stages.report`: the accuracy of a quantized stage build end to end.
- :mod:`~dsa_export.stages.record`: ``pipeline.json`` itself (:class:`~dsa_export.stages.record.Pipeline`).
- :mod:`~dsa_export.stages.session`: the stages run in order (:class:`~dsa_export.stages.session.PipelineSession`),
  :mod:`~dsa_export.stages.ray_actors` the same in Ray actors.

Importing this package imports nothing else; each module imports torch, onnxruntime or TensorRT only
where it runs them.
"""
