"""The stages of a pipeline in Ray actors, one per stage, on whichever node has its GPU.

:func:`open_on_ray` returns the same :class:`~dsa_export.stages.session.PipelineSession` as the
local pipeline, with each stage's :class:`~dsa_export.stages.session.LocalStage` living in an
actor: the actor asks for one GPU (``num_gpus=1``) when the cluster has GPUs, opens the stage there
(Ray makes the GPU it was given ``cuda:0`` for the actor) and keeps the stage's decode caches.
Activations move from actor to actor through Ray's object store: a stage's call takes the previous
stage's result as an object reference, so the driver never copies hidden states and stage ``i`` can
start micro-batch ``m + 1`` while stage ``i + 1`` runs ``m``.

Every node must see the pipeline folder at the same path (a shared filesystem); engines must have
been built on the GPU type of the node that runs them. Ray is an optional extra
(``pip install "dsa-export[ray]"``).

A stage actor that dies (its process killed, its node lost) fails the call waiting on it with one
error naming the stage; a call that waits longer than ``timeout`` seconds fails too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from dsa_export.errors import DSAUserError, require
from dsa_export.stages.session import StageLostError

INSTALL = 'pip install "dsa-export[ray]"'


def ray_module():
    return require("ray", "--ray (pipeline stages on Ray)", INSTALL)


def connect(address: str, *, num_cpus: int | None = None):
    """Join the Ray cluster at ``address``; ``auto``: the one this machine belongs to, or a new
    local one when none runs. Returns the ``ray`` module."""
    ray = ray_module()
    if ray.is_initialized():
        return ray
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address != "auto":
        options["address"] = address
    elif num_cpus is not None:
        options["num_cpus"] = num_cpus
    try:
        ray.init(**options)
    except ConnectionError as exc:
        raise DSAUserError(f"cannot reach the Ray cluster at {address} ({exc}); start it with `ray start --head` or "
                           "pass its address.") from exc
    return ray


class _StageActor:
    """The body of a stage's actor (made a Ray actor class by :func:`_actor_class`)."""

    def __init__(self, folder: str, stage: dict, links: list, runtime: str, verify: bool, threads: int | None):
        from dsa_export.stages.record import StageFiles
        from dsa_export.stages.session import InLink, LocalStage, _where, open_stage

        files = StageFiles.from_dict(stage)
        session = open_stage(Path(folder), files, runtime, 0, verify=verify, threads=threads)
        self.stage = LocalStage(files.index, session, [InLink(*link) for link in links], _where(session))

    def run(self, feeds: dict, slot: str | None, *upstream: dict) -> dict[str, np.ndarray]:
        return self.stage.run(feeds, slot, *upstream)

    def drop(self, slot: str | None) -> None:
        self.stage.drop(slot)

    def describe(self) -> dict[str, Any]:
        import socket

        return {**self.stage.describe(), "node": socket.gethostname()}


_ACTOR = None


def _actor_class(ray):
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = ray.remote(max_restarts=0, max_task_retries=0)(_StageActor)
    return _ACTOR


class RayStage:
    """A stage in a Ray actor, scheduled through object references."""

    def __init__(self, ray, actor, index: int, timeout: float | None):
        self.ray = ray
        self.actor = actor
        self.index = index
        self.siblings: list[RayStage] = [self]
        self._described = self._get(actor.describe.remote(), timeout)

    def _get(self, ref, timeout: float | None):
        ray = self.ray
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise DSAUserError(f"stage {self.index}'s Ray actor gave no result within {timeout:g} s; check the cluster "
                               "(`ray status`) or raise the timeout.") from None
        except ray.exceptions.RayActorError as exc:
            # The error may come through a later stage whose input could not be computed: name the
            # stage whose actor is gone.
            dead = next((s.index for s in self.siblings if not s.alive()), self.index)
            found = re.search(r"The actor is dead because ([^\n]*?)\.?$", str(exc), re.MULTILINE)
            reason = f" because {found.group(1).split('. ')[0]}" if found else ""  # Ray's first sentence
            raise StageLostError(f"stage {dead}'s Ray actor died{reason}; the pipeline cannot go on, open it "
                               "again.") from None
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, DSAUserError):
                raise DSAUserError(f"stage {self.index}: {cause}") from None
            raise

    def alive(self) -> bool:
        try:
            self.ray.get(self.actor.describe.remote(), timeout=10)
        except self.ray.exceptions.RayActorError:
            return False
        except Exception:  # busy or slow, not known to be dead
            return True
        return True

    def submit(self, feeds: Any, slot: str | None, upstream: list[Any]) -> Any:
        return self.actor.run.remote(feeds, slot, *upstream)

    def result(self, pending: Any, timeout: float | None) -> dict[str, np.ndarray]:
        return self._get(pending, timeout)

    def drop(self, slot: str | None) -> None:
        self._get(self.actor.drop.remote(slot), None)

    def describe(self) -> dict[str, Any]:
        return dict(self._described)

    def close(self) -> None:
        try:
            self.ray.kill(self.actor)
        except Exception:  # already gone
            pass


def open_on_ray(folder: str | Path, address: str = "auto", runtime: str = "auto", *, verify: bool = True,
                threads: int | None = None, timeout: float | None = 600.0, num_cpus: int | None = None,
                pipeline=None):
    """Open every stage of ``folder`` in its own Ray actor; returns a PipelineSession.
    ``pipeline``: the folder's ``pipeline.json`` when the caller has read it already."""
    from dsa_export.stages.record import read_pipeline
    from dsa_export.stages.session import PipelineSession, stage_inputs

    folder = Path(folder).resolve()
    pipeline = pipeline if pipeline is not None else read_pipeline(folder)
    ray = connect(address, num_cpus=num_cpus)
    resources = ray.cluster_resources()
    gpus = 1 if resources.get("GPU", 0) >= 1 and runtime != "onnxruntime" else 0
    stages = len(pipeline.stages)
    # Without GPUs the stages share the CPUs; with one GPU each they need no CPU of their own.
    cpus = 0 if gpus else min(1.0, float(resources.get("CPU", 1)) / stages)
    actor_class = _actor_class(ray)
    handles: list[RayStage] = []
    try:
        for stage, (_sources, links) in zip(pipeline.stages, stage_inputs(pipeline)):
            actor = actor_class.options(num_gpus=gpus, num_cpus=cpus, name=None).remote(
                str(folder), stage.to_dict(), [(l.source, l.output, l.input) for l in links], runtime, verify, threads)
            handles.append(RayStage(ray, actor, stage.index, timeout))
        for handle in handles:
            handle.siblings = handles
    except BaseException:
        for handle in handles:
            handle.close()
        raise
    session = PipelineSession(pipeline, handles, f"pipeline of {stages} stages on Ray ({folder})", timeout=timeout,
                              folder=folder)
    session.share = ray.put  # the step's inputs go to the object store once, not once per stage
    return session


__all__ = ["RayStage", "connect", "open_on_ray"]
