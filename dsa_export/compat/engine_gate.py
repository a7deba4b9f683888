"""The engine gate: refuse to deserialize an engine that cannot run here, and say exactly why.

TensorRT's own answer to a wrong engine is "engine plan file is not compatible with this version of
TensorRT" or a crash inside a plugin. Before deserializing, we compare the engine's manifest (the
``manifest.json`` written next to it at build time; keys documented in docs/compat.md) with the
running environment.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export.compat.findings import Finding
from dsa_export.compat.probe import plugin_library_state, probe_environment
from dsa_export.compat.records import EnvironmentProbe, ProbeSettings
from dsa_export.compat.versions import parse_version
from dsa_export.errors import DSAUserError

MANIFEST_NAME = "manifest.json"

# First four bytes of serialized plans. "ftrt": TensorRT plans (the tag Torch-TensorRT also checks);
# "vtrt": TensorRT-RTX 1.x plans (measured on an engine built here with TensorRT-RTX 1.7.1).
PLAN_MAGICS: dict[bytes, str] = {b"ftrt": "TensorRT", b"vtrt": "TensorRT-RTX"}

HARDWARE_COMPATIBILITY = ("none", "ampere_plus", "same_compute_capability")
ENGINE_BACKENDS = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}

# Version-compatible engines. TensorRT 10.16.1 Developer Guide, Version Compatibility
# (docs.nvidia.com/deeplearning/tensorrt/10.16.1/inference-library/version-compatibility.html):
# "engines built with TensorRT 8 work with TensorRT 9 and TensorRT 10 runtimes" and "Version
# compatibility is supported from version 8.6; the plan must be built with a version at least 8.6
# or higher, and the runtime must be 8.6 or higher." TensorRT 11.1.0 Engine Compatibility
# (docs.nvidia.com/deeplearning/tensorrt/11.1.0/inference-library/engine-compatibility.html):
# "engines built with TensorRT 10 work with TensorRT 11".
VERSION_COMPATIBLE_SINCE = (8, 6)
CROSS_MAJOR_VERSION_COMPATIBLE = {(8, 9), (8, 10), (9, 10), (10, 11)}

# Components the gate needs when it probes by itself.
GATE_COMPONENTS = ("driver", "tensorrt", "tensorrt_rtx", "plugin_library")


@dataclass(frozen=True)
class EngineRequirements:
    """What an engine needs from the machine that loads it (from its manifest.json)."""

    trt_version: str  # full version that built it, e.g. "10.3.0.26"
    backend: str = "tensorrt"  # "tensorrt" | "tensorrt-rtx"
    compute_capability: tuple[str, ...] = ()  # GPU(s) it was built for, e.g. ("9.0",)
    hardware_compatibility: str = "none"  # one of HARDWARE_COMPATIBILITY
    version_compatible: bool = False  # built with the version-compatible flag
    plugin_library_sha256: str | None = None  # sha256 of the DSA plugin library it was built with
    #: The plugin library is serialized into the (version-compatible) plan: TensorRT loads it from
    #: there, so the loader neither needs nor loads the library file (as trtexec does).
    plugins_serialized: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["compute_capability"] = list(self.compute_capability)
        return data

    @classmethod
    def from_manifest(cls, data: dict[str, Any], where: str) -> EngineRequirements:
        """Read the keys from a manifest (top level, or under an "engine" object). DSAUserError if malformed."""
        nested = data.get("engine")
        section: dict[str, Any] = nested if isinstance(nested, dict) else data
        trt_version = section.get("trt_version")
        if not isinstance(trt_version, str) or parse_version(trt_version) is None:
            raise DSAUserError(
                f'{where} has no valid "trt_version", so the engine cannot be checked; rebuild it with `dsa-export build`.'
            )
        backend = section.get("backend", "tensorrt")
        if backend not in ENGINE_BACKENDS:
            raise DSAUserError(
                f"{where} names backend {backend!r}, which is not one of {', '.join(ENGINE_BACKENDS)}."
            )
        capability = section.get("compute_capability", [])
        capabilities = tuple(
            [capability] if isinstance(capability, str) else [str(c) for c in capability]
        )
        hardware = section.get("hardware_compatibility", "none")
        if hardware in (None, False):
            hardware = "none"
        if hardware not in HARDWARE_COMPATIBILITY:
            raise DSAUserError(
                f"{where} has hardware_compatibility {hardware!r}, which is not one of {', '.join(HARDWARE_COMPATIBILITY)}."
            )
        sha = section.get("plugin_library_sha256")
        return cls(
            trt_version=trt_version,
            backend=backend,
            compute_capability=capabilities,
            hardware_compatibility=hardware,
            version_compatible=bool(section.get("version_compatible", False)),
            plugin_library_sha256=str(sha) if sha else None,
            # only version-compatible plans carry serialized plugin libraries
            plugins_serialized=bool(section.get("plugins_serialized")) and bool(sha)
            and bool(section.get("version_compatible")),
        )


def sniff_engine(path: Path) -> str:
    """Name of the runtime whose plan tag ``path`` starts with; DSAUserError when it is not an engine."""
    if not path.exists():
        raise DSAUserError(f"Engine file {path} does not exist.")
    if path.is_dir():
        raise DSAUserError(f"{path} is a folder; pass the engine file inside it.")
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if not head:
        raise DSAUserError(
            f"{path} is empty, so it is not a TensorRT engine; rebuild it with `dsa-export build`."
        )
    if head[:4] in PLAN_MAGICS:
        return PLAN_MAGICS[head[:4]]
    if path.suffix == ".onnx" or (head[:1] == b"\x08" and b"onnx" in head.lower()):
        raise DSAUserError(
            f"{path} is an ONNX model, not a TensorRT engine; build an engine from it with `dsa-export build`."
        )
    if b"\x00" not in head:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            raise DSAUserError(f"{path} is a text file, not a TensorRT engine.")
    tags = "/".join(tag.decode() for tag in PLAN_MAGICS)
    raise DSAUserError(
        f"{path} does not start with a TensorRT plan tag ({tags}), so it is not an engine this tool can check."
    )


def read_requirements(engine: Path, manifest_data: dict | None = None) -> EngineRequirements:
    """Check that ``engine`` is a plan and read the manifest.json next to it; ``manifest_data``: that
    manifest parsed already (by :func:`dsa_export.manifest.read_manifest`, which a loader has called
    first), so that it is not read again."""
    sniff_engine(engine)
    manifest = engine.parent / MANIFEST_NAME
    if manifest_data is not None:
        return EngineRequirements.from_manifest(manifest_data, str(manifest))
    if not manifest.is_file():
        raise DSAUserError(
            f"{engine} has no {MANIFEST_NAME} next to it, so its TensorRT version, GPU and plugin library cannot be "
            "checked; rebuild it with `dsa-export build`, which writes one."
        )
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DSAUserError(
            f"{manifest} is not valid JSON ({exc}); rebuild the engine with `dsa-export build`."
        ) from exc
    if not isinstance(data, dict):
        raise DSAUserError(
            f"{manifest} is not a JSON object; rebuild the engine with `dsa-export build`."
        )
    return EngineRequirements.from_manifest(data, str(manifest))


def _runtime_accepts(
    engine: tuple[int, ...], runtime: tuple[int, ...], version_compatible: bool, backend: str
) -> bool:
    if not version_compatible:
        length = max(3, min(len(engine), len(runtime)))
        return engine[:length] == runtime[:length]
    if backend == "tensorrt" and engine[:2] < VERSION_COMPATIBLE_SINCE:
        return False
    if engine[0] == runtime[0]:
        return runtime >= engine
    return backend == "tensorrt" and (engine[0], runtime[0]) in CROSS_MAJOR_VERSION_COMPATIBLE


def compare_engine(
    requirements: EngineRequirements, probe: EnvironmentProbe, device: int = 0
) -> list[Finding]:
    """Findings (all errors) for everything that stops this environment from loading the engine."""
    findings: list[Finding] = []
    component = ENGINE_BACKENDS[requirements.backend]
    label = "TensorRT-RTX" if requirements.backend == "tensorrt-rtx" else "TensorRT"
    runtime = probe.component(component)
    engine_version = parse_version(requirements.trt_version) or ()
    if not runtime.found:
        findings.append(
            Finding(
                "engine_runtime_missing",
                "error",
                "engine",
                f"The engine was built with {label} {requirements.trt_version} but {label} is not available here ({runtime.reason}).",
                f"Install {label} {requirements.trt_version} to load it.",
            )
        )
    else:
        runtime_version = parse_version(runtime.version) or ()
        if not _runtime_accepts(
            engine_version, runtime_version, requirements.version_compatible, requirements.backend
        ):
            how = "version-compatible " if requirements.version_compatible else ""
            findings.append(
                Finding(
                    "engine_tensorrt_version_mismatch",
                    "error",
                    "engine",
                    f"The {how}engine was built with {label} {requirements.trt_version} and cannot be loaded by the installed {label} {runtime.version}.",
                    f"Install {label} {requirements.trt_version} or rebuild the engine here with `dsa-export build`"
                    + (
                        ""
                        if requirements.version_compatible
                        else " (add --version-compatible to allow newer runtimes)"
                    )
                    + ".",
                )
            )
    gpu = probe.gpus[device] if device < len(probe.gpus) else None
    gpu_sm = parse_version(gpu.compute_capability) if gpu and gpu.compute_capability else None
    if gpu is None:
        findings.append(
            Finding(
                "engine_no_gpu",
                "error",
                "engine",
                f"The engine needs an NVIDIA GPU and GPU {device} is not visible here.",
                "Load it on a machine with the GPU it was built for.",
            )
        )
    elif gpu_sm is not None and requirements.compute_capability:
        built = [parse_version(cc) for cc in requirements.compute_capability]
        if requirements.hardware_compatibility == "ampere_plus":
            fits = gpu_sm[:2] >= (8, 0)
            needs = "compute capability 8.0 or newer (hardware compatibility ampere_plus)"
        else:
            fits = gpu_sm[:2] in {cc[:2] for cc in built if cc}
            needs = f"compute capability {', '.join(requirements.compute_capability)}"
        if not fits:
            findings.append(
                Finding(
                    "engine_compute_capability_mismatch",
                    "error",
                    "engine",
                    f"The engine was built for {needs} but GPU {gpu.index} ({gpu.name}) is {gpu.compute_capability}.",
                    "Rebuild the engine on this GPU with `dsa-export build` (or build with hardware compatibility for Ampere and newer).",
                )
            )
    if requirements.plugin_library_sha256 and not requirements.plugins_serialized:
        plugin = probe.component("plugin_library")
        if not plugin.found:
            findings.append(
                Finding(
                    "engine_plugin_library_missing",
                    "error",
                    "engine",
                    f"The engine contains DSA plugin layers but the plugin library is {plugin_library_state(plugin)}.",
                    "Build the same plugin library with `dsa-export plugins build` or set DSA_EXPORT_PLUGIN_LIB to it.",
                )
            )
        elif plugin.details.get("sha256") != requirements.plugin_library_sha256:
            findings.append(
                Finding(
                    "engine_plugin_library_mismatch",
                    "error",
                    "engine",
                    f"The plugin library at {plugin.details.get('path')} (sha256 {str(plugin.details.get('sha256'))[:12]}) is not the one the engine was built with (sha256 {requirements.plugin_library_sha256[:12]}).",
                    "Point DSA_EXPORT_PLUGIN_LIB at the library the engine was built with, or rebuild the engine.",
                )
            )
    return findings


def check_engine(
    engine: str | Path, probe: EnvironmentProbe, device: int = 0
) -> tuple[EngineRequirements, list[Finding]]:
    """Read ``engine``'s requirements and compare them with ``probe``; DSAUserError if it is not a checkable engine."""
    requirements = read_requirements(Path(engine))
    return requirements, compare_engine(requirements, probe, device)


class GateProbe:
    """The environment facts the gate needs, probed on first use and then kept: one probe for all
    the engines one session opens (a pipeline's stages), not one per engine."""

    def __init__(self) -> None:
        self._probe: EnvironmentProbe | None = None

    def get(self) -> EnvironmentProbe:
        if self._probe is None:  # only what loading needs: no torch or onnxruntime import
            self._probe = probe_environment(ProbeSettings(components=GATE_COMPONENTS))
        return self._probe


def gate_engine(
    engine: str | Path, probe: EnvironmentProbe | GateProbe | None = None, device: int = 0,
    manifest_data: dict | None = None,
) -> EngineRequirements:
    """Call before deserializing ``engine``: returns its requirements or raises DSAUserError with the reason.

    ``probe``: the environment, or a :class:`GateProbe` shared by the engines of one session (None:
    probe here). ``manifest_data``: the engine's manifest.json parsed already (else it is read)."""
    requirements = read_requirements(Path(engine), manifest_data)
    if probe is None:
        probe = GateProbe()
    if isinstance(probe, GateProbe):
        probe = probe.get()
    findings = compare_engine(requirements, probe, device)
    if findings:
        first = findings[0]
        more = (
            f" ({len(findings) - 1} more problem(s): run `dsa-export check --engine {engine}`)"
            if len(findings) > 1
            else ""
        )
        raise DSAUserError(f"Refusing to load {engine}: {first.message} {first.fix}{more}")
    return requirements


__all__ = [
    "MANIFEST_NAME",
    "PLAN_MAGICS",
    "EngineRequirements",
    "GateProbe",
    "check_engine",
    "compare_engine",
    "gate_engine",
    "read_requirements",
    "sniff_engine",
]
