// What the Python engine gate (dsa_export/compat/engine_gate.py) checks that C++ can see, as plain
// functions of the manifest's fields and the versions found here. No TensorRT or CUDA: the rule is
// compiled and tested on machines without either (tests/test_cpp_runtime.py compares it with the
// Python rule case by case).
#pragma once

#include <string>
#include <vector>

namespace dsa
{

//! The leading dotted number of ``text`` ("10.3.0.26" -> {10, 3, 0, 26}, "12.4+cu124" -> {12, 4});
//! empty when there is none (as compat.versions.parse_version).
std::vector<int> parseVersion(std::string const& text);

std::string formatVersion(std::vector<int> const& version);

//! Whether TensorRT ``runtime`` may deserialize a plan built by TensorRT ``engine``.
//!
//! Mirrors engine_gate._runtime_accepts: without the version-compatible flag the first three parts
//! must match; with it, a TensorRT plan needs a builder of 8.6 or newer and then loads in a newer
//! runtime of the same major version, or of the next major version for the pairs TensorRT documents
//! (8 -> 9, 8 -> 10, 9 -> 10, 10 -> 11). The C++ side knows three parts of the linked library's
//! version (getInferLibVersion), so only three parts of the engine's are compared.
bool runtimeAccepts(std::vector<int> const& engine, std::vector<int> const& runtime, bool versionCompatible,
    std::string const& backend);

//! Empty when the GPU of compute capability ``major``.``minor`` runs an engine built for
//! ``built`` (e.g. {"9.0"}) with ``hardwareCompatibility`` ("none", "ampere_plus",
//! "same_compute_capability"); else what it needs, e.g. "compute capability 9.0". An engine that
//! records no compute capability is accepted, as in the Python gate.
std::string computeCapabilityNeeds(std::vector<std::string> const& built, std::string const& hardwareCompatibility,
    int major, int minor);

} // namespace dsa
