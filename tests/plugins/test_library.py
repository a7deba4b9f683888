"""The plugin library finder, library_info and the ``dsa-export plugins`` CLI (CPU only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.ops.contract import PLUGIN_OPS
from dsa_export.plugins import library as lib

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No in-tree build, an empty cache and no environment override."""
    monkeypatch.setattr(lib, "source_dir", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(lib.ENV_VAR, raising=False)
    return tmp_path


def _fake(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(b"not really a library")
    return path


def test_nothing_found_when_nothing_is_built(isolated):
    for kind in ("plugin", "kernels", "static"):
        assert lib.find_library(kind) is None
    with pytest.raises(DSAUserError, match="dsa-export plugins build"):
        lib.require_library("plugin")


def test_env_var_names_a_file_or_a_directory(isolated, monkeypatch):
    plugin = _fake(isolated / "a", "libdsa_plugins.so")
    kernels = _fake(isolated / "a", "libdsa_kernels.so")
    monkeypatch.setenv(lib.ENV_VAR, str(plugin))
    assert lib.find_library("plugin") == plugin.resolve()
    assert lib.find_library("kernels") == kernels.resolve()  # same directory is searched
    monkeypatch.setenv(lib.ENV_VAR, str(isolated / "a"))
    assert lib.find_library("plugin") == plugin.resolve()
    renamed = _fake(isolated / "b", "my_dsa_plugins.so")
    monkeypatch.setenv(lib.ENV_VAR, str(renamed))
    assert lib.find_library("plugin") == renamed.resolve()


def test_cache_dir_is_searched(isolated):
    static = _fake(isolated / "cache" / "dsa-export" / "plugins", "libdsa_plugins_static.so")
    assert lib.find_library("static") == static.resolve()


def test_unknown_kind_is_a_bug_not_a_user_error(isolated):
    with pytest.raises(ValueError):
        lib.find_library("bogus")  # type: ignore[arg-type]


def test_library_info_reads_symbols_and_sidecar(tmp_path):
    import _ctypes  # any ELF shared object with a known export

    src = Path(_ctypes.__file__)
    if src.suffix != ".so":
        pytest.skip("needs an ELF extension module")
    target = tmp_path / "libdsa_kernels.so"
    target.write_bytes(src.read_bytes())
    (tmp_path / lib.BUILD_INFO_NAME).write_text(
        json.dumps({"cuda_architectures": ["80", "90"], "tensorrt_version": "11.1.0"})
    )
    info = lib.library_info(target)
    assert info.kind == "kernels"
    assert "PyInit__ctypes" in info.exported_symbols
    assert "dsa_indexer_topk" in info.missing_symbols
    assert info.cuda_architectures == ["80", "90"]
    assert info.tensorrt_version == "11.1.0"
    assert len(info.sha256) == 64
    assert json.loads(json.dumps(info.to_dict()))["kind"] == "kernels"
    # The pure-Python ELF reader agrees with nm on the export we care about.
    assert "PyInit__ctypes" in lib._elf_dynamic_symbols(target)


def test_library_info_of_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(DSAUserError):
        lib.library_info(tmp_path / "nope.so")


def test_cuda_arch_parsing():
    from dsa_export.cli.plugins_cmd import _parse_archs

    assert _parse_archs("90") == "90"
    assert _parse_archs("sm_80, 90;100") == "80;90;100"
    assert _parse_archs("9.0") == "90"
    assert _parse_archs("90a") == "90a"
    assert _parse_archs("native") == "native"
    assert _parse_archs(None) is None
    with pytest.raises(DSAUsageError):
        _parse_archs("hopper")


def _cli(args, **env_overrides):
    env = dict(os.environ, PYTHONPATH=str(REPO), **env_overrides)
    return subprocess.run([sys.executable, "-m", "dsa_export", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_plugins_path_fails_with_build_instructions(tmp_path):
    proc = _cli(["plugins", "path", "--kind", "static"], XDG_CACHE_HOME=str(tmp_path), DSA_EXPORT_PLUGIN_LIB="")
    if proc.returncode == 0:
        pytest.skip("a static-registration library is built in this checkout")
    assert proc.returncode == 1
    assert "dsa-export plugins build" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_plugins_path_prints_the_library(tmp_path):
    plugin = _fake(tmp_path, "libdsa_plugins.so")
    proc = _cli(["plugins", "path"], DSA_EXPORT_PLUGIN_LIB=str(plugin))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(plugin.resolve())


def test_build_without_cmake_is_one_clear_sentence(tmp_path):
    proc = _cli(["plugins", "build", "--build-dir", str(tmp_path / "b")], PATH=str(tmp_path))
    assert proc.returncode == 1
    assert "cmake was not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_cuda_arch_is_a_usage_error(tmp_path):
    from dsa_export.cli import plugins_cmd

    if plugins_cmd.shutil.which("cmake") is None or plugins_cmd._find_nvcc() is None:
        pytest.skip("the arch check runs after the cmake/nvcc checks")
    proc = _cli(["plugins", "build", "--build-dir", str(tmp_path / "b"), "--cuda-arch", "hopper"])
    assert proc.returncode == 2
    assert "--cuda-arch" in proc.stderr


def test_importing_the_loader_imports_neither_torch_nor_tensorrt():
    code = (
        "import sys, dsa_export.plugins, dsa_export.plugins.kernels, dsa_export.cli.plugins_cmd;"
        "bad = [m for m in ('torch', 'tensorrt') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_load_into_tensorrt_uses_the_registry_once_per_process(isolated, monkeypatch):
    from tests.trt.fakes import fake_tensorrt

    plugin = _fake(isolated / "lib", "libdsa_plugins.so")
    monkeypatch.setenv(lib.ENV_VAR, str(plugin))
    trt = fake_tensorrt("10.15.1")  # its load_library returns None for creators already registered
    assert lib.load_into_tensorrt(trt) == plugin.resolve()
    assert lib.load_into_tensorrt(trt) == plugin.resolve()  # a second stage's open in the same process
    assert trt.calls["plugins"] == [str(plugin.resolve())]
    with pytest.raises(DSAUserError, match="could not load"):
        lib.load_into_tensorrt(fake_tensorrt("10.15.1", plugin_ok=False))


def test_creators_registered_by_someone_else_are_used(tmp_path, caplog):
    from tests.trt.fakes import fake_tensorrt

    first, second = _fake(tmp_path / "a", "libdsa_plugins.so"), _fake(tmp_path / "b", "libdsa_plugins.so")
    trt = fake_tensorrt("11.1.0")
    trt.get_plugin_registry().load_library(str(first))  # not through us: e.g. the application did
    with caplog.at_level("WARNING", logger="dsa_export.plugins.library"):
        assert lib.load_plugin_library(trt, second) == second.resolve()
    assert "already registered" in caplog.text and "DSAIndexerTopK" in caplog.text
    assert lib.registered_creators(trt.get_plugin_registry()) == list(PLUGIN_OPS)


def test_a_null_handle_without_our_creators_is_a_user_error(tmp_path):
    from tests.trt.fakes import fake_tensorrt

    other = fake_tensorrt("11.1.0", library_creators=("SomeoneElsesPlugin",))
    other.get_plugin_registry().load_library("other.so")
    path = _fake(tmp_path, "libdsa_plugins.so")
    refusing = fake_tensorrt("11.1.0", plugin_ok=False)
    with pytest.raises(DSAUserError, match=r"could not load the plugin library .*built against this TensorRT version"):
        lib.load_plugin_library(refusing, path)
    assert lib.registered_creators(other.get_plugin_registry()) == []
