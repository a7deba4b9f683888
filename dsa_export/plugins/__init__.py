"""The DSA plugin libraries: where they are, what is in them, and how to build them.

Three shared libraries come out of the CMake project in ``plugins/``:

``kernels`` (``libdsa_kernels.so``)
    The CUDA kernels behind a C ABI (``plugins/api/dsa_kernels.h``); used by tests and benchmarks
    through ctypes and needs no TensorRT.
``plugin`` (``libdsa_plugins.so``)
    The TensorRT plugin library that exports ``getCreators``/``setLoggerFinder``; load it with
    ``IPluginRegistry.load_library`` or ``trtexec --dynamicPlugins``.
``static`` (``libdsa_plugins_static.so``)
    The same plugins registered at load time, for tools that only ``dlopen`` (``polygraphy run
    --plugins``).

Nothing in this package imports TensorRT or initializes CUDA.
"""

from dsa_export.plugins.library import (
    LIBRARY_NAMES,
    LibraryInfo,
    default_build_dir,
    find_library,
    library_info,
    load_into_tensorrt,
    require_library,
    search_dirs,
    source_dir,
)

__all__ = [
    "LIBRARY_NAMES",
    "LibraryInfo",
    "default_build_dir",
    "find_library",
    "library_info",
    "load_into_tensorrt",
    "require_library",
    "search_dirs",
    "source_dir",
]
