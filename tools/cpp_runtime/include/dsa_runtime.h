// dsa_runtime: generation (greedy or sampled) over a paged build of `dsa-export build`, as a library.
//
//   dsa::Runtime runtime("out/paged", options);        // a paged build folder or a pipeline.json
//   std::vector<int> slots = runtime.prefill(ids, lengths);   // prompts, concatenated, and their lengths
//   // or runtime.prefill(ids, lengths, {{0.7F, 0.9F, seed}, ...}): per-prompt temperature, top_p, seed
//   runtime.token(slots[0]);                            // the first generated token of prompt 0
//   runtime.decode();                                   // one more token for every live sequence
//   runtime.release(slots[0]);                          // the sequence ends, its cache pages are free
//   runtime.submit(ids, lengths); runtime.step();       // or: continuous batching, one call for everyone
//
// One Runtime serves up to `slots` sequences at once. Each stage of the build runs on its GPU with
// one CUDA stream per GPU; the cache pools are allocated once on each stage's GPU and stay there;
// the prefill runs on the build's first optimization profile and the decode steps on its decode
// profile, each decode step replaying a CUDA graph captured once per batch size (where capture
// fails, the step is enqueued as is). Pages are handed to sequences as they grow (page 0 is the
// graph's scratch page) and come back on release(). Each call's next tokens are chosen on the last
// stage's GPU by dsa_sample_tokens of libdsa_kernels.so (found beside the plugin library, or
// given), so only the token ids come to the host: greedy, or sampled with each sequence's own
// temperature, top_p and seed (Philox4x32-10 at counter = the token's index in its generation,
// reproducible with dsa_export.runtime.philox). Without that library the tokens are the host's
// arg max of the logits (greedy only).
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
    bool keepLogits{false};    //!< keep each sequence's last logits for logits() (copied to the host)
    std::string kernels;       //!< libdsa_kernels.so, the device sampler (else $DSA_EXPORT_KERNELS_LIB, else beside the plugin library)
    int64_t prefillChunk{0};   //!< tokens per prompt and prefill call (0: the prefill profile's sequence max); longer prompts go in chunks
    int64_t stepTokens{0};     //!< step(): at most this many rows x tokens per row in one call, by shorter chunks (0: no limit; at least a token a row)
};

//! How a sequence chooses its tokens (dsa_export.runtime.generate.SamplingSettings' rules).
struct SamplingParams
{
    float temperature{0.F};    //!< 0: greedy (the arg max, lowest id on ties)
    float topP{1.F};           //!< nucleus: (0, 1]
    uint64_t seed{0};          //!< Philox4x32-10 key; token k of the generation draws at counter k
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
    int64_t maxPrompt{0};      //!< tokens per prompt in one prefill call (longer prompts, up to maxTokens, go in chunks)
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
    //! prefill and pick each one's first token; returns prompt i's slot at index i. A prompt longer
    //! than one prefill call takes (RuntimeOptions::prefillChunk, at most RuntimeInfo::maxPrompt) is
    //! fed in chunks, each chunk's tokens written to the caches before the next reads them; all of
    //! a prompt's pages are taken first, so a refused or failed call leaves nothing behind.
    std::vector<int> prefill(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths);

    //! The same, prompt i choosing its tokens with ``sampling[i]`` (one per prompt, or empty: greedy).
    std::vector<int> prefill(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths,
        std::vector<SamplingParams> const& sampling);

    //! Continuous batching: admit prompts into free slots (their pages taken now) without running
    //! them; each step() then feeds them. Returns prompt i's slot at index i.
    std::vector<int> submit(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths,
        std::vector<SamplingParams> const& sampling = {});

    //! One call for every live sequence: a token for each sequence that is generating, and the next
    //! chunk (RuntimeOptions::prefillChunk, at most RuntimeInfo::maxPrompt) of each submitted prompt,
    //! in one call on the prefill profile (a call with no prompt to feed is a decode() step, on the
    //! decode profile and its CUDA graphs). Returns the slots that got a token: the generating
    //! ones and those whose prompt's last chunk ran (its first token). RuntimeOptions::stepTokens
    //! bounds the call (rows x tokens per row) by feeding shorter chunks, so prompts joining do not
    //! hold up the generating sequences' next token by more than that. If the call fails, the
    //! prompts it was feeding are released (their slots and pages are free); the rest stay.
    std::vector<int> step();

    //! Change how the sequence in ``slot`` chooses its next tokens (its draws keep counting).
    void setSampling(int slot, SamplingParams const& sampling);

    //! Change RuntimeOptions::prefillChunk and RuntimeOptions::stepTokens for the calls to come
    //! (0: the default; a serving loop may tighten the step budget when many sequences generate).
    void setChunking(int64_t prefillChunk, int64_t stepTokens);

    //! One token for every live sequence; returns their slots, in order.
    std::vector<int> decode();

    //! End the sequence in ``slot``; its slot and pages are free again.
    void release(int slot);

    //! The token the last call chose for ``slot`` (the next input of its sequence); -1 while its
    //! submitted prompt still waits for step().
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

    //! Whether tokens are chosen on the device (libdsa_kernels.so was found), else by the host (greedy only).
    bool deviceSampling() const;

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
//! The same with per-prompt sampling: ``temperature``, ``top_p`` and ``seeds`` hold ``count`` values each
//! (any may be null: 0, 1 and 0).
int dsa_runtime_prefill_sampled(dsa_runtime* runtime, int64_t const* ids, int64_t const* lengths, int count,
    float const* temperature, float const* top_p, uint64_t const* seeds, int* slots);
//! Change how the sequence in ``slot`` chooses its next tokens.
int dsa_runtime_set_sampling(dsa_runtime* runtime, int slot, float temperature, float top_p, uint64_t seed);
//! One token per live sequence; their slots into ``slots`` (room for ``capacity``), their count into ``count``.
int dsa_runtime_decode(dsa_runtime* runtime, int* slots, int capacity, int* count);
//! Runtime::submit: ``count`` prompts admitted without running; slot i of prompt i into ``slots``.
int dsa_runtime_submit(dsa_runtime* runtime, int64_t const* ids, int64_t const* lengths, int count, int* slots);
//! Runtime::step: the slots that got a token into ``slots`` (room for ``capacity``), their count into ``count``.
int dsa_runtime_step(dsa_runtime* runtime, int* slots, int capacity, int* count);
//! Runtime::setChunking: prompt tokens per row and prefill call, and a step's rows x tokens (0: defaults).
int dsa_runtime_set_chunking(dsa_runtime* runtime, int64_t prefill_chunk, int64_t step_tokens);
int dsa_runtime_release(dsa_runtime* runtime, int slot);
//! The last chosen token of ``slot`` into ``token``.
int dsa_runtime_token(dsa_runtime const* runtime, int slot, int64_t* token);
//! The last error's sentence ("" when none); ``runtime`` may be null (the last failed open).
char const* dsa_runtime_error(dsa_runtime const* runtime);

#ifdef __cplusplus
}
#endif
