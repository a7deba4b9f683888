// The GPU side of the runtime library: the stages of a paged build opened on their GPUs (one
// stream per GPU), their cache pools allocated once and kept there, and one call of every stage
// (a prefill on profile 0, a decode step on the decode profile, replayed from a CUDA graph), and
// the choice of each row's next token on the last stage's GPU (dsa_sample_tokens of
// libdsa_kernels.so, loaded at run time) so that only the token ids come to the host.
// Needs TensorRT and the CUDA runtime; the host side (slots, pages, the call's inputs) is
// scheduler.h and paged_plan.h.
#pragma once

#include "engine_io.h"
#include "paged_plan.h"
#include "scheduler.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dsa
{

//! A captured decode step of one stage, instantiated.
struct GraphExec
{
    int device{0};
    cudaGraphExec_t exec{nullptr};
    GraphExec() = default;
    GraphExec(GraphExec const&) = delete;
    GraphExec& operator=(GraphExec const&) = delete;
    ~GraphExec();
};

//! One cache pool of a stage: one buffer when the engine writes it in place, else two that swap.
struct PagedPool
{
    std::string present;
    Shape shape;
    bool inPlace{false};
    DeviceBuffer buffers[2];
};

//! The buffers of a prefill or a decode call of one stage. Decode buffers are sized for every
//! slot once, so a captured graph's addresses stay valid; prefill buffers grow as needed.
struct CallBuffers
{
    nvinfer1::IExecutionContext* context{nullptr};
    int profile{0};
    std::map<std::string, DeviceBuffer> outputs;    //!< outputs other than pools
    std::map<std::string, DeviceBuffer> crossings;  //!< linked inputs copied from another GPU
};

struct PagedStage
{
    StageRun* run{nullptr};
    std::unique_ptr<nvinfer1::IExecutionContext> decodeContext;  //!< the decode profile's (null: one profile)
    std::vector<std::string> inputNames;
    std::map<std::string, PagedPool> pools;          //!< by past_* name
    std::map<std::string, DeviceBuffer> controls;    //!< input_ids, query_start, query_lengths, block_table
    CallBuffers calls[2];                            //!< [0] prefill, [1] decode
    int parity{0};                                   //!< which buffer of a swapped pool holds the cache
    std::map<std::pair<int64_t, int>, std::unique_ptr<GraphExec>> graphs;  //!< by (batch, parity)
    bool graphsFailed{false};
};

//! dsa_sample_tokens of libdsa_kernels.so (plugins/api/dsa_kernels.h, ABI 5), loaded with dlopen.
class DeviceSampler
{
public:
    DeviceSampler() = default;
    DeviceSampler(DeviceSampler const&) = delete;
    DeviceSampler& operator=(DeviceSampler const&) = delete;
    ~DeviceSampler();

    //! Load the first candidate that exports the sampler; the note says which, or why none.
    void open(std::vector<std::string> const& candidates, std::string& note);
    bool available() const { return mSample != nullptr; }

    //! Enqueue the choice of rows' tokens on ``stream`` (pointers on the current device); throws
    //! UserError with the library's message when the call is refused.
    void sample(void const* logits, int64_t rowStride, int32_t* out, float const* temperature, float const* topP,
        uint64_t const* seeds, int64_t const* offsets, int64_t rows, int64_t vocab, int32_t dtype,
        cudaStream_t stream) const;

private:
    using SampleFn = int32_t (*)(void const*, int64_t, int32_t*, float const*, float const*, uint64_t const*,
        int64_t const*, int64_t, int64_t, int32_t, void*);
    using ErrorFn = char const* (*)();
    void* mHandle{nullptr};
    SampleFn mSample{nullptr};
    ErrorFn mLastError{nullptr};
};

class PagedEngine : public PlanSession
{
public:
    //! Read the plan, check it is paged and fits ``request``, open the stages and allocate their pools.
    PagedEngine(RunOptions const& options, PagedRequest const& request, bool graphs);
    ~PagedEngine();

    SchedulerLimits const& limits() const { return mLimits; }
    int stages() const { return static_cast<int>(mPaged.size()); }
    std::vector<std::string> const& notes() const { return mNotes; }
    bool graphsActive() const;

    //! One call of every stage, then each row's next token: chosen on the last stage's GPU by the
    //! device sampler under ``sampling`` (one entry per row), or, without libdsa_kernels.so, the
    //! host's arg max of the logits (greedy rows only). Afterwards tokens() holds the ids, and
    //! logits() the rows' logits on the host when ``keepLogits`` (or on the host path).
    void run(CallInputs const& call, SamplingRows const& sampling, bool keepLogits);

    //! Whether tokens are chosen on the device (libdsa_kernels.so was found).
    bool deviceSampling() const { return mSampler.available(); }

    //! The last call's token of each row.
    std::vector<int64_t> const& tokens() const { return mTokens; }

    //! The last call's logits, [rows, vocab()] of logitType() in host memory (see run()).
    void const* logits() const { return mLogitsHost.ptr; }
    LogitType logitType() const { return mLogitType; }
    int64_t vocab() const { return mVocab; }

private:
    void prepareStage(PagedStage& stage);
    void allocatePools(PagedStage& stage);
    void allocateControls(PagedStage& stage);
    void allocateStaging();

    void callStage(PagedStage& stage, CallInputs const& call);
    void uploadControls(PagedStage& stage, CallInputs const& call);
    void bindInputs(PagedStage& stage, CallInputs const& call);
    Shape controlShape(std::string const& name, CallInputs const& call) const;
    void* linkedInput(PagedStage& stage, std::string const& name, Link const& link, CallInputs const& call);
    void bindOutputs(PagedStage& stage, CallInputs const& call);
    void* otherOutput(PagedStage& stage, std::string const& name, CallInputs const& call);

    //! Replay the step's graph, or run the step and capture it for the next time.
    void decodeStep(PagedStage& stage, CallInputs const& call);
    void capture(PagedStage& stage, nvinfer1::IExecutionContext& context, std::pair<int64_t, int> key);

    //! The last stage's logits shape of this call, checked: [batch, vocab].
    Shape logitsShape(CallInputs const& call);
    //! Enqueue the copy of the logits to the host (mLogitsHost); the caller synchronizes.
    void copyLogits(CallInputs const& call);
    //! Enqueue the device sampler and the copy of its ids (mTokensHost); the caller synchronizes.
    void sampleOnDevice(CallInputs const& call, SamplingRows const& sampling);
    void allocateSampler();

    SchedulerLimits mLimits;
    bool mGraphs{true};
    std::vector<std::string> mNotes;
    std::vector<PagedStage> mPaged;  //!< one per stage (released before the stages)
    PinnedBuffer mControlsHost;      //!< the call's ids, starts, counts and table, staged for the copies
    size_t mControlsBytes{0};
    PinnedBuffer mLogitsHost;
    size_t mLogitsBytes{0};
    LogitType mLogitType{LogitType::kFLOAT};
    int64_t mVocab{-1};
    DeviceSampler mSampler;
    DeviceBuffer mSamplingDevice;    //!< per-row temperature, top_p, seeds, offsets, then the int32 ids
    PinnedBuffer mSamplingHost;      //!< the same, staged
    size_t mSamplingBytes{0};
    std::vector<int64_t> mTokens;
};

} // namespace dsa
