// dsa_runtime: greedy generation over a paged build of `dsa-export build`, as a library.
//
//   dsa::Runtime runtime("out/paged", options);        // a paged build folder or a pipeline.json
//   std::vector<int> slots = runtime.prefill(ids, lengths);   // prompts, concatenated, and their lengths
//   runtime.token(slots[0]);                            // the first generated token of prompt 0
//   runtime.decode();                                   // one more token for every live sequence
//   runtime.release(slots[0]);                          // the sequence ends, its cache pages are free
//
// One Runtime serves up to `slots` sequences at once. Each stage of the build runs on its GPU with
// one CUDA stream per GPU; the cache pools are allocated once on each stage's GPU and stay there;
// the prefill runs on the build's first optimization profile and the decode steps on its decode
// profile, each decode step replaying a CUDA graph captured once per batch size (where capture
// fails, the step is enqueued as is). Pages are handed to sequences as they grow (page 0 is the
// graph's scratch page) and come back on release().
//
// Errors: std::invalid_argument for a call the arguments or the runtime's state rule out (empty
// prompt, unknown slot, more prompts than free slots); std::runtime_error for the rest (a build
// that is not paged, limits the build's profiles refuse, full cache pools, CUDA or TensorRT
// failures). what() is one sentence. A refused call changes nothing.
//
// Needs TensorRT 10 or 11 and the CUDA runtime to link; this header includes neither. A C
// interface over the same object follows the class.
#pragma once

#ifdef __cplusplus
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dsa
{

struct RuntimeOptions
{
    std::string plugins;       //!< the DSA plugin library (else $DSA_EXPORT_PLUGIN_LIB, else the manifest's)
    int device{-1};            //!< the GPU of a single build folder (default 0); a pipeline's come from pipeline.json
    int slots{0};              //!< sequences at once (0: the profile's batch max)
    int64_t maxTokens{0};      //!< tokens per sequence, prompt included (0: the build's max_pages x page)
    int64_t pages{0};          //!< cache pages per pool, scratch page included (0: what the slots can fill, capped by the profile)
    bool cudaGraphs{true};     //!< replay each decode step from a CUDA graph
    bool keepLogits{false};    //!< keep each sequence's last logits for logits()
};

//! What an opened runtime allows.
struct RuntimeInfo
{
    int stages{0};
    int slots{0};
    int prefillBatch{0};       //!< prompts of one prefill() call
    int64_t page{0};           //!< tokens per cache page
    int64_t pages{0};          //!< pages per pool, scratch included
    int64_t maxTokens{0};      //!< tokens per sequence
    int64_t maxPrompt{0};      //!< tokens per prompt
    int64_t vocab{-1};         //!< logits per token (-1: not recorded in the manifest)
    std::vector<std::string> notes;  //!< one line per stage and pool: GPU, bytes, in place or swapped
};

class Runtime
{
public:
    //! Open ``path`` (a paged build folder, its manifest.json, or a pipeline.json over paged stage
    //! builds): the plan and the limits are checked before any engine is deserialized.
    explicit Runtime(std::string const& path, RuntimeOptions const& options = RuntimeOptions());
    ~Runtime();
    Runtime(Runtime&&) noexcept;
    Runtime& operator=(Runtime&&) noexcept;
    Runtime(Runtime const&) = delete;
    Runtime& operator=(Runtime const&) = delete;

    //! Admit prompts (prompt i: ``lengths[i]`` ids of ``ids``, in order) into free slots, run their
    //! prefill and pick each one's first token; returns prompt i's slot at index i.
    std::vector<int> prefill(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths);

    //! One token for every live sequence; returns their slots, in order.
    std::vector<int> decode();

    //! End the sequence in ``slot``; its slot and pages are free again.
    void release(int slot);

    //! The greedy token the last call picked for ``slot`` (the next input of its sequence).
    int64_t token(int slot) const;

    //! The logits that call gave ``slot`` (needs RuntimeOptions::keepLogits).
    std::vector<float> logits(int slot) const;

    //! Tokens of ``slot``'s sequence in the caches.
    int64_t length(int slot) const;

    //! The slots that hold a sequence, in order.
    std::vector<int> liveSlots() const;

    RuntimeInfo const& info() const;

    //! Whether decode steps replay CUDA graphs (false once a capture failed, or when turned off).
    bool graphsActive() const;

private:
    class Impl;
    std::unique_ptr<Impl> mImpl;
};

} // namespace dsa

extern "C" {
#else
#include <stdint.h>
#endif

//! The C interface: a Runtime behind an opaque handle. Functions returning int give 0 on success
//! and -1 on failure, whose sentence dsa_runtime_error gives (the open's with a null handle).
typedef struct dsa_runtime dsa_runtime;

//! Open ``path`` with ``slots`` sequences at once (0: the build's batch) and the plugin library
//! ``plugins`` (may be null); null on failure.
dsa_runtime* dsa_runtime_open(char const* path, int slots, char const* plugins);
void dsa_runtime_close(dsa_runtime* runtime);
//! ``count`` prompts, ``lengths[i]`` ids each, concatenated in ``ids``; slot i of prompt i into ``slots``.
int dsa_runtime_prefill(dsa_runtime* runtime, int64_t const* ids, int64_t const* lengths, int count, int* slots);
//! One token per live sequence; their slots into ``slots`` (room for ``capacity``), their count into ``count``.
int dsa_runtime_decode(dsa_runtime* runtime, int* slots, int capacity, int* count);
int dsa_runtime_release(dsa_runtime* runtime, int slot);
//! The greedy token of ``slot`` into ``token``.
int dsa_runtime_token(dsa_runtime const* runtime, int slot, int64_t* token);
//! The last error's sentence ("" when none); ``runtime`` may be null (the last failed open).
char const* dsa_runtime_error(dsa_runtime const* runtime);

#ifdef __cplusplus
}
#endif
