/*
 * The CPU emulator behind cuda_emu.h: fibers for threads, a scheduler with several orders, the
 * warp collectives and PTX instructions the kernels use (semantics from the PTX ISA's fragment
 * layouts, never from the kernels' own helpers), checked shared and global memory, and the few
 * CUDA runtime calls the launchers make. The C API at the bottom is what tests/emulation drives.
 *
 * Faults (an out-of-range access, a refused copy, a barrier deadlock, divergent collectives, too
 * much shared memory) abort the launch, are recorded with the thread that caused them, and make
 * the launch's cudaGetLastError() report an error, as an illegal address does on a GPU.
 */
#include "cuda_emu.h"

// The emulator names the coordinates itself.
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim

#include <algorithm>
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace emu
{

ThreadCoords* gCoords = nullptr;

namespace
{

// ---- configuration ------------------------------------------------------------------------------
enum Order : int
{
    kLOCKSTEP = 0, //!< ready threads run in thread order, each until it blocks
    kREVERSE = 1,  //!< the same from the last thread and the last CTA
    kSCRAMBLED = 2 //!< a seeded random ready thread at every switch, preemption at atomics and loads
};
enum CopyMode : int
{
    kAT_ISSUE = 0, //!< cp.async lands when issued
    kAT_WAIT = 1   //!< cp.async lands at the wait that retires its group; the destination is NaN until then
};

struct DeviceSpec
{
    char const* name;
    int major;
    int minor;
    int sms;
    int smemOptin;
};
// Opt-in shared memory per block from the CUDA programming guide's compute capability table.
DeviceSpec const kDEVICES[] = {
    {"H200 (sm_90)", 9, 0, 132, 232448},
    {"L40S (sm_89)", 8, 9, 142, 101376},
    {"A100 (sm_80)", 8, 0, 108, 166912},
    {"T4 (sm_75)", 7, 5, 40, 65536},
};
constexpr int kNUM_DEVICES = sizeof(kDEVICES) / sizeof(kDEVICES[0]);
constexpr size_t kDEFAULT_SMEM = 48 * 1024;

struct Config
{
    int order{kLOCKSTEP};
    int copyMode{kAT_WAIT};
    uint64_t seed{1};
    int residentCtas{2};
    double yieldProbability{0.25};
} gConfig;
int gDevice = 0;
std::mt19937_64 gRng(1);

// ---- faults -------------------------------------------------------------------------------------
std::string gFault;          // first fault since the last clear
cudaError_t gLastError = cudaSuccess;
bool gInLaunch = false;
sigjmp_buf gFaultJmp;

struct Stats
{
    uint64_t launches{0};
    uint64_t ctas{0};
    uint64_t threads{0};
    uint64_t switches{0};
    uint64_t collectives{0};
    uint64_t copies{0};
    uint64_t mma{0};
} gStats;

// ---- global allocations -------------------------------------------------------------------------
constexpr unsigned char kGUARD_BYTE = 0xA5;
constexpr size_t kFRONT_GUARD = 64;
constexpr size_t kBACK_GUARD = 64;

struct Allocation
{
    int id;
    unsigned char* map;
    size_t mapBytes;
    unsigned char* data;
    size_t bytes;
    size_t frontGuard; //!< pattern bytes right before data
    size_t backGuard;  //!< pattern bytes right after data
};
std::map<uintptr_t, Allocation> gAllocs; // by data address
int gNextAllocId = 0;
size_t gPage = 4096;

size_t roundUp(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

Allocation const* findAllocation(void const* p)
{
    auto const a = reinterpret_cast<uintptr_t>(p);
    auto it = gAllocs.upper_bound(a);
    if (it == gAllocs.begin())
    {
        return nullptr;
    }
    --it;
    Allocation const& al = it->second;
    if (a >= reinterpret_cast<uintptr_t>(al.data) && a <= reinterpret_cast<uintptr_t>(al.data) + al.bytes)
    {
        return &al;
    }
    return nullptr;
}

std::string describeAddress(void const* p)
{
    if (p == nullptr)
    {
        return "NULL";
    }
    auto const a = reinterpret_cast<uintptr_t>(p);
    Allocation const* best = nullptr;
    long long bestDist = 0;
    for (auto const& kv : gAllocs)
    {
        Allocation const& al = kv.second;
        auto const lo = reinterpret_cast<uintptr_t>(al.data);
        auto const hi = lo + al.bytes;
        long long const d = a < lo ? static_cast<long long>(lo - a) : (a >= hi ? static_cast<long long>(a - hi + 1) : 0);
        if (best == nullptr || d < bestDist)
        {
            best = &al;
            bestDist = d;
        }
    }
    char buf[200];
    if (best == nullptr)
    {
        std::snprintf(buf, sizeof(buf), "%p (no allocation)", p);
        return buf;
    }
    auto const lo = reinterpret_cast<uintptr_t>(best->data);
    if (a < lo)
    {
        std::snprintf(buf, sizeof(buf), "%p (%llu bytes before buffer #%d of %zu bytes)", p,
            static_cast<unsigned long long>(lo - a), best->id, best->bytes);
    }
    else if (a >= lo + best->bytes)
    {
        std::snprintf(buf, sizeof(buf), "%p (%llu bytes past the end of buffer #%d of %zu bytes)", p,
            static_cast<unsigned long long>(a - lo - best->bytes), best->id, best->bytes);
    }
    else
    {
        std::snprintf(buf, sizeof(buf), "%p (byte %llu of buffer #%d of %zu bytes)", p,
            static_cast<unsigned long long>(a - lo), best->id, best->bytes);
    }
    return buf;
}

// ---- fibers -------------------------------------------------------------------------------------
#if defined(__x86_64__)
extern "C" void emu_ctx_switch(void** saveSp, void* loadSp);
asm(R"(
    .text
    .globl emu_ctx_switch
    .type emu_ctx_switch,@function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    fldcw (%rsp)
    ldmxcsr 8(%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_ctx_switch, .-emu_ctx_switch
)");
#endif

constexpr size_t kSTACK_BYTES = 256 * 1024;

struct Stack
{
    unsigned char* map{nullptr};
    size_t bytes{0};
    unsigned char* lo() const
    {
        return map + gPage;
    }
    unsigned char* hi() const
    {
        return map + bytes;
    }
};
std::vector<Stack> gStackPool;

Stack takeStack()
{
    if (!gStackPool.empty())
    {
        Stack s = gStackPool.back();
        gStackPool.pop_back();
        return s;
    }
    Stack s;
    s.bytes = kSTACK_BYTES + gPage;
    void* m = mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
    {
        std::fprintf(stderr, "emu: out of memory for fiber stacks\n");
        std::abort();
    }
    s.map = static_cast<unsigned char*>(m);
    mprotect(s.map, gPage, PROT_NONE); // overflow guard
    return s;
}

// ---- CTAs and threads ---------------------------------------------------------------------------
enum class State
{
    kREADY,
    kBARRIER,
    kWARP,
    kDONE
};

enum class Collective
{
    kNONE,
    kSYNCWARP,
    kSHFL_XOR,
    kSHFL_UP,
    kSHFL_DOWN,
    kSHFL_IDX,
    kBALLOT,
    kMATCH_ANY,
    kLDMATRIX,
    kMMA
};

char const* collectiveName(Collective c)
{
    switch (c)
    {
    case Collective::kNONE: return "none";
    case Collective::kSYNCWARP: return "__syncwarp";
    case Collective::kSHFL_XOR: return "__shfl_xor_sync";
    case Collective::kSHFL_UP: return "__shfl_up_sync";
    case Collective::kSHFL_DOWN: return "__shfl_down_sync";
    case Collective::kSHFL_IDX: return "__shfl_sync";
    case Collective::kBALLOT: return "__ballot_sync";
    case Collective::kMATCH_ANY: return "__match_any_sync";
    case Collective::kLDMATRIX: return "ldmatrix";
    case Collective::kMMA: return "mma.sync";
    }
    return "?";
}

struct PendingCopy
{
    unsigned char* dst;
    unsigned char const* src;
    int cpBytes;
    int srcBytes;
};

struct Cta;

struct Thread
{
    ThreadCoords coords{};
    int linear{0};
    int lane{0};
    int warp{0};
    Cta* cta{nullptr};
    State state{State::kREADY};
    Stack stack;
    void* sp{nullptr};
#if !defined(__x86_64__)
    ucontext_t uc;
#endif
    // warp collective in flight
    Collective op{Collective::kNONE};
    uint32_t opMask{0};
    char const* opText{nullptr};
    uint64_t in[10]{};
    uint64_t out[4]{};
    int opArg{0};
    // cp.async
    std::vector<PendingCopy> openGroup;
    std::deque<std::vector<PendingCopy>> groups;
};

struct WarpSlot
{
    uint32_t arrived{0};
    Collective op{Collective::kNONE};
    uint32_t mask{0};
    char const* text{nullptr};
};

//! Shared memory of one resident CTA: [static | guard page | dynamic | guard page].
struct SmemArena
{
    unsigned char* map{nullptr};
    size_t staticRegion{64 * 1024};
    size_t dynRegion{0};
    size_t mapBytes{0};
    // per CTA
    size_t staticUsed{0};
    unsigned char* staticLo{nullptr};
    unsigned char* dynBase{nullptr};
    size_t dynBytes{0};
    std::unordered_map<int, unsigned char*> sites;

    unsigned char* staticTop() const
    {
        return map + staticRegion;
    }
    unsigned char* dynTop() const
    {
        return map + staticRegion + gPage + dynRegion;
    }
};

struct Cta
{
    int linear{0};
    uint3 bid{};
    std::vector<Thread> threads;
    std::vector<WarpSlot> warps;
    int live{0};
    int atBarrier{0};
    SmemArena* smem{nullptr};
};

struct LaunchState
{
    void const* kernel{nullptr};
    LaunchConfig const* cfg{nullptr};
    ThreadBody body{nullptr};
    void* closure{nullptr};
    int nthreads{0};
    std::deque<Thread*> ready;       // lockstep / reverse
    std::vector<Thread*> readyPool;  // scrambled
    void* schedulerSp{nullptr};
#if !defined(__x86_64__)
    ucontext_t schedulerUc;
#endif
    size_t smemLimit{0};
};

LaunchState* gLaunch = nullptr;
Thread* gCurrent = nullptr;
std::vector<SmemArena*> gArenas;
std::unordered_map<void const*, int> gMaxDynSmem; // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel

std::string threadName(Thread const* t)
{
    if (t == nullptr)
    {
        return "host";
    }
    char buf[160];
    std::snprintf(buf, sizeof(buf), "block (%u,%u,%u) thread (%u,%u,%u) [warp %d lane %d]", t->coords.blockIdx.x,
        t->coords.blockIdx.y, t->coords.blockIdx.z, t->coords.threadIdx.x, t->coords.threadIdx.y,
        t->coords.threadIdx.z, t->warp, t->lane);
    return buf;
}

void switchToScheduler();

[[noreturn]] void faultNoReturn(std::string const& message);

void fault(char const* fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    faultNoReturn(buf);
}

[[noreturn]] void faultNoReturn(std::string const& message)
{
    if (gFault.empty())
    {
        gFault = message + " at " + threadName(gCurrent);
    }
    if (gInLaunch && gCurrent != nullptr)
    {
        siglongjmp(gFaultJmp, 1); // abandon every fiber of the launch
    }
    std::fprintf(stderr, "emu: fault outside a kernel: %s\n", gFault.c_str());
    std::abort();
}

void enqueueReady(Thread* t)
{
    t->state = State::kREADY;
    if (gConfig.order == kSCRAMBLED)
    {
        gLaunch->readyPool.push_back(t);
    }
    else
    {
        gLaunch->ready.push_back(t);
    }
}

void switchTo(Thread* t)
{
    gCurrent = t;
    gCoords = &t->coords;
    ++gStats.switches;
#if defined(__x86_64__)
    emu_ctx_switch(&gLaunch->schedulerSp, t->sp);
#else
    swapcontext(&gLaunch->schedulerUc, &t->uc);
#endif
    gCurrent = nullptr;
}

void switchToScheduler()
{
    Thread* t = gCurrent;
#if defined(__x86_64__)
    emu_ctx_switch(&t->sp, gLaunch->schedulerSp);
#else
    swapcontext(&t->uc, &gLaunch->schedulerUc);
#endif
    gCurrent = t;
    gCoords = &t->coords;
}

//! Blocks the current thread (state already set) until someone makes it ready.
void block()
{
    switchToScheduler();
}

void threadExit();

extern "C" void emuFiberEntry()
{
    Thread* t = gCurrent;
    gLaunch->body(gLaunch->closure);
    (void) t;
    threadExit();
}

void initFiber(Thread* t)
{
    if (t->stack.map == nullptr)
    {
        t->stack = takeStack();
    }
#if defined(__x86_64__)
    auto top = reinterpret_cast<uintptr_t>(t->stack.hi()) & ~static_cast<uintptr_t>(15);
    auto* sp = reinterpret_cast<uint64_t*>(top);
    *--sp = 0;                                            // fake return address of the entry
    *--sp = reinterpret_cast<uint64_t>(&emuFiberEntry);   // ret target
    for (int i = 0; i < 6; ++i)
    {
        *--sp = 0; // rbp rbx r12 r13 r14 r15
    }
    sp -= 2;
    uint32_t mxcsr = 0;
    uint16_t fpucw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    std::memcpy(reinterpret_cast<unsigned char*>(sp) + 8, &mxcsr, 4);
    std::memcpy(reinterpret_cast<unsigned char*>(sp), &fpucw, 2);
    t->sp = sp;
#else
    getcontext(&t->uc);
    t->uc.uc_stack.ss_sp = t->stack.lo();
    t->uc.uc_stack.ss_size = t->stack.hi() - t->stack.lo();
    t->uc.uc_link = nullptr;
    makecontext(&t->uc, reinterpret_cast<void (*)()>(&emuFiberEntry), 0);
#endif
}

// ---- shared memory ------------------------------------------------------------------------------
SmemArena* arenaFor(int slot)
{
    while (static_cast<int>(gArenas.size()) <= slot)
    {
        auto* a = new SmemArena();
        size_t maxOptin = 0;
        for (auto const& d : kDEVICES)
        {
            maxOptin = std::max<size_t>(maxOptin, d.smemOptin);
        }
        a->dynRegion = roundUp(maxOptin + 64, gPage);
        a->mapBytes = a->staticRegion + gPage + a->dynRegion + gPage;
        void* m = mmap(nullptr, a->mapBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
        {
            std::fprintf(stderr, "emu: out of memory for shared memory\n");
            std::abort();
        }
        a->map = static_cast<unsigned char*>(m);
        mprotect(a->map + a->staticRegion, gPage, PROT_NONE);
        mprotect(a->map + a->mapBytes - gPage, gPage, PROT_NONE);
        gArenas.push_back(a);
    }
    return gArenas[slot];
}

void resetArena(SmemArena* a, size_t dynBytes)
{
    a->sites.clear();
    a->staticUsed = 0;
    a->staticLo = a->staticTop();
    a->dynBytes = dynBytes;
    a->dynBase = a->dynTop() - roundUp(dynBytes, 16);
    // NaN in every float, half and bfloat16 element: a read before a write shows in the result.
    std::memset(a->dynBase, 0xFF, a->dynTop() - a->dynBase);
}

bool inShared(SmemArena const* a, unsigned char const* p, size_t bytes)
{
    if (p >= a->staticLo && p + bytes <= a->staticTop())
    {
        return true;
    }
    return p >= a->dynBase && p + bytes <= a->dynBase + a->dynBytes;
}

unsigned char* sharedFromAddress(uint32_t addr, size_t bytes, char const* what)
{
    SmemArena* a = gCurrent->cta->smem;
    unsigned char* p = a->map + addr;
    if (static_cast<size_t>(addr) >= a->mapBytes || !inShared(a, p, bytes))
    {
        fault("%s: shared address 0x%x (+%zu bytes) is outside the CTA's shared memory (static %zu B, dynamic %zu B)",
            what, addr, bytes, a->staticUsed, a->dynBytes);
    }
    return p;
}

void landCopy(PendingCopy const& c)
{
    if (c.srcBytes > 0)
    {
        std::memcpy(c.dst, c.src, c.srcBytes);
    }
    if (c.cpBytes > c.srcBytes)
    {
        std::memset(c.dst + c.srcBytes, 0, c.cpBytes - c.srcBytes);
    }
}

// ---- barriers and collectives -------------------------------------------------------------------
void releaseBarrier(Cta* cta)
{
    cta->atBarrier = 0;
    if (gConfig.order == kREVERSE)
    {
        for (int i = static_cast<int>(cta->threads.size()) - 1; i >= 0; --i)
        {
            if (cta->threads[i].state == State::kBARRIER)
            {
                enqueueReady(&cta->threads[i]);
            }
        }
    }
    else
    {
        for (auto& t : cta->threads)
        {
            if (t.state == State::kBARRIER)
            {
                enqueueReady(&t);
            }
        }
    }
}

void threadExit()
{
    Thread* t = gCurrent;
    Cta* cta = t->cta;
    t->state = State::kDONE;
    cta->live -= 1;
    WarpSlot& ws = cta->warps[t->warp];
    if (ws.arrived != 0 && (ws.mask >> t->lane & 1U))
    {
        fault("thread exited while its warp waits for it at %s (mask 0x%08x)", collectiveName(ws.op), ws.mask);
    }
    // Exited threads count as arrived at __syncthreads (bar.sync counts the CTA's non-exited threads).
    if (cta->atBarrier > 0 && cta->atBarrier == cta->live)
    {
        releaseBarrier(cta);
    }
    switchToScheduler();
    std::abort(); // never resumed
}

void completeCollective(Cta* cta, int warp);

//! Posts the current thread's part of a warp collective; returns once the whole mask has arrived.
void arrive(Collective op, uint32_t mask, char const* text = nullptr)
{
    Thread* t = gCurrent;
    Cta* cta = t->cta;
    int const nthreads = static_cast<int>(cta->threads.size());
    int const warpBase = t->warp * 32;
    uint32_t const exists = nthreads - warpBase >= 32 ? 0xffffffffU : ((1U << (nthreads - warpBase)) - 1U);
    if (!(mask >> t->lane & 1U))
    {
        fault("%s with a mask (0x%08x) that leaves out the calling lane", collectiveName(op), mask);
    }
    if (mask & ~exists)
    {
        fault("%s with a mask (0x%08x) naming lanes the block does not have", collectiveName(op), mask);
    }
    WarpSlot& ws = cta->warps[t->warp];
    if (ws.arrived == 0)
    {
        ws.op = op;
        ws.mask = mask;
        ws.text = text;
    }
    else if (ws.op != op || ws.mask != mask || ws.text != text)
    {
        fault("divergent warp collectives: this lane is at %s (mask 0x%08x) while lanes 0x%08x wait at %s (mask 0x%08x)",
            collectiveName(op), mask, ws.arrived, collectiveName(ws.op), ws.mask);
    }
    t->op = op;
    t->opMask = mask;
    t->opText = text;
    ws.arrived |= 1U << t->lane;
    ++gStats.collectives;
    if (ws.arrived == mask)
    {
        completeCollective(cta, t->warp);
        return;
    }
    for (int l = 0; l < 32; ++l)
    {
        if ((mask >> l & 1U) && !(ws.arrived >> l & 1U) && cta->threads[warpBase + l].state == State::kDONE)
        {
            fault("%s waits for lane %d, which has exited", collectiveName(op), l);
        }
    }
    t->state = State::kWARP;
    block();
}

float bitsToFloat(uint32_t b)
{
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

uint32_t floatToBits(float f)
{
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

//! One 16-bit element of type `kind` ("bf16" or "f16") as a float.
float halfToFloat(uint16_t h, bool bf16)
{
    if (bf16)
    {
        return bitsToFloat(static_cast<uint32_t>(h) << 16);
    }
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
}

void executeLdmatrix(Cta* cta, int warp, std::vector<Thread*> const& lanes);
void executeMma(Cta* cta, int warp, std::vector<Thread*> const& lanes);

void completeCollective(Cta* cta, int warp)
{
    WarpSlot& ws = cta->warps[warp];
    uint32_t const mask = ws.mask;
    std::vector<Thread*> lanes(32, nullptr);
    for (int l = 0; l < 32; ++l)
    {
        if (mask >> l & 1U)
        {
            lanes[l] = &cta->threads[warp * 32 + l];
        }
    }
    auto valueOf = [&](int l) -> uint64_t { return lanes[l]->in[0]; };
    switch (ws.op)
    {
    case Collective::kSYNCWARP: break;
    case Collective::kSHFL_XOR:
    case Collective::kSHFL_UP:
    case Collective::kSHFL_DOWN:
    case Collective::kSHFL_IDX:
        for (int l = 0; l < 32; ++l)
        {
            if (lanes[l] == nullptr)
            {
                continue;
            }
            Thread* t = lanes[l];
            int const width = t->opArg;
            int const segBase = l / width * width;
            int src = l;
            int const arg = static_cast<int>(t->in[1]);
            if (ws.op == Collective::kSHFL_XOR)
            {
                src = l ^ arg;
                if (src >= segBase + width)
                {
                    src = l;
                }
            }
            else if (ws.op == Collective::kSHFL_UP)
            {
                src = l - arg >= segBase ? l - arg : l;
            }
            else if (ws.op == Collective::kSHFL_DOWN)
            {
                src = l + arg < segBase + width ? l + arg : l;
            }
            else
            {
                src = segBase + (arg % width);
            }
            if (lanes[src] == nullptr)
            {
                fault("%s: lane %d reads lane %d, which is not in the mask 0x%08x", collectiveName(ws.op), l, src, mask);
            }
            t->out[0] = valueOf(src);
        }
        break;
    case Collective::kBALLOT:
    {
        uint32_t bits = 0;
        for (int l = 0; l < 32; ++l)
        {
            if (lanes[l] != nullptr && lanes[l]->in[0] != 0)
            {
                bits |= 1U << l;
            }
        }
        for (int l = 0; l < 32; ++l)
        {
            if (lanes[l] != nullptr)
            {
                lanes[l]->out[0] = bits;
            }
        }
        break;
    }
    case Collective::kMATCH_ANY:
        for (int l = 0; l < 32; ++l)
        {
            if (lanes[l] == nullptr)
            {
                continue;
            }
            uint32_t same = 0;
            for (int m = 0; m < 32; ++m)
            {
                if (lanes[m] != nullptr && lanes[m]->in[0] == lanes[l]->in[0])
                {
                    same |= 1U << m;
                }
            }
            lanes[l]->out[0] = same;
        }
        break;
    case Collective::kLDMATRIX: executeLdmatrix(cta, warp, lanes); break;
    case Collective::kMMA: executeMma(cta, warp, lanes); break;
    case Collective::kNONE: break;
    }
    ws.arrived = 0;
    ws.op = Collective::kNONE;
    for (int l = 0; l < 32; ++l)
    {
        if (lanes[l] != nullptr && lanes[l] != gCurrent && lanes[l]->state == State::kWARP)
        {
            enqueueReady(lanes[l]);
        }
    }
}

// ---- PTX ----------------------------------------------------------------------------------------
struct PtxInstr
{
    std::string opcode;                      //!< e.g. "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
    std::vector<std::vector<int>> operands;  //!< each operand: operand numbers (a {..} vector has several)
    std::vector<long long> immediates;       //!< per operand: the immediate when it is not a %N (else -1)
    std::vector<bool> isAddress;             //!< operand written as [..]
};

std::unordered_map<char const*, PtxInstr> gPtxCache; // keyed by the call site's string literal

PtxInstr const& parsePtx(char const* text)
{
    auto it = gPtxCache.find(text);
    if (it != gPtxCache.end())
    {
        return it->second;
    }
    PtxInstr ins;
    std::string s(text);
    size_t i = s.find_first_not_of(" \t\n");
    size_t j = s.find_first_of(" \t\n;", i);
    ins.opcode = s.substr(i, j - i);
    std::string rest = j == std::string::npos ? "" : s.substr(j);
    // split the operand list at top-level commas
    std::vector<std::string> parts;
    int depth = 0;
    std::string cur;
    for (char ch : rest)
    {
        if (ch == ';')
        {
            break;
        }
        if (ch == '{' || ch == '[')
        {
            ++depth;
        }
        if (ch == '}' || ch == ']')
        {
            --depth;
        }
        if (ch == ',' && depth == 0)
        {
            parts.push_back(cur);
            cur.clear();
            continue;
        }
        cur += ch;
    }
    if (cur.find_first_not_of(" \t\n") != std::string::npos)
    {
        parts.push_back(cur);
    }
    for (auto const& p : parts)
    {
        std::vector<int> nums;
        long long imm = -1;
        bool addr = p.find('[') != std::string::npos;
        for (size_t k = 0; k < p.size(); ++k)
        {
            if (p[k] == '%')
            {
                nums.push_back(std::atoi(p.c_str() + k + 1));
            }
        }
        if (nums.empty())
        {
            imm = std::atoll(p.c_str() + p.find_first_not_of(" \t\n"));
        }
        ins.operands.push_back(nums);
        ins.immediates.push_back(imm);
        ins.isAddress.push_back(addr);
    }
    return gPtxCache.emplace(text, std::move(ins)).first->second;
}

bool startsWith(std::string const& s, char const* prefix)
{
    return s.rfind(prefix, 0) == 0;
}

void storeOut(PtxOperand const& op, uint64_t bits)
{
    std::memcpy(op.ref, &bits, static_cast<size_t>(op.bytes));
}

void executeLdmatrix(Cta* cta, int warp, std::vector<Thread*> const& lanes)
{
    (void) cta;
    (void) warp;
    Thread* any = nullptr;
    for (auto* t : lanes)
    {
        if (t != nullptr)
        {
            any = t;
            break;
        }
    }
    std::string const& op = parsePtx(any->opText).opcode;
    int const num = op.find(".x4") != std::string::npos ? 4 : (op.find(".x2") != std::string::npos ? 2 : 1);
    bool const trans = op.find(".trans") != std::string::npos;
    // Lanes 8j .. 8j+7 give the row addresses of matrix j (PTX ISA, ldmatrix).
    for (int j = 0; j < num; ++j)
    {
        unsigned char* rows[8];
        for (int r = 0; r < 8; ++r)
        {
            Thread* src = lanes[8 * j + r];
            auto const addr = static_cast<uint32_t>(src->in[0]);
            if (addr % 16 != 0)
            {
                gCurrent = src;
                fault("ldmatrix: row address 0x%x is not 16-byte aligned", addr);
            }
            Thread* saved = gCurrent;
            gCurrent = src;
            rows[r] = sharedFromAddress(addr, 16, "ldmatrix");
            gCurrent = saved;
        }
        // Fragment: lane i holds row i/4, columns 2(i%4) and 2(i%4)+1 (.trans: of the transpose).
        for (int i = 0; i < 32; ++i)
        {
            uint16_t e0 = 0;
            uint16_t e1 = 0;
            if (!trans)
            {
                std::memcpy(&e0, rows[i / 4] + 2 * (2 * (i % 4)), 2);
                std::memcpy(&e1, rows[i / 4] + 2 * (2 * (i % 4) + 1), 2);
            }
            else
            {
                std::memcpy(&e0, rows[2 * (i % 4)] + 2 * (i / 4), 2);
                std::memcpy(&e1, rows[2 * (i % 4) + 1] + 2 * (i / 4), 2);
            }
            lanes[i]->out[j] = static_cast<uint32_t>(e0) | (static_cast<uint32_t>(e1) << 16);
        }
    }
}

//! Value of an e4m3fn bit pattern (PTX ISA: 1 sign, 4 exponent bits with bias 7, 3 mantissa bits;
//! S.1111.111 is NaN, there is no infinity), written out here rather than taken from cuda_fp8.h.
float e4m3ToFloat(uint8_t b)
{
    int const e = (b >> 3) & 15;
    int const m = b & 7;
    float v;
    if (e == 15 && m == 7)
    {
        v = std::nanf("");
    }
    else if (e == 0)
    {
        v = std::ldexp(static_cast<float>(m), -9);
    }
    else
    {
        v = std::ldexp(static_cast<float>(8 + m), e - 10);
    }
    return (b & 0x80) ? -v : v;
}

//! mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 with the PTX ISA's fragment layouts for 8-bit
//! A/B: a_i (4 per register) holds row g (+8 for i in 4..7 and 12..15), column 4c + (i & 3) (+16 for
//! i >= 8); b_i holds row (k index) 4c + (i & 3) (+16 for i >= 4), column g; C/D as m16n8k16.
void executeMmaE4m3(std::vector<Thread*> const& lanes)
{
    float A[16][32];
    float B[32][8];
    float C[16][8];
    for (int i = 0; i < 32; ++i)
    {
        Thread* t = lanes[i];
        int const g = i >> 2;
        int const c = i & 3;
        for (int k = 0; k < 16; ++k)
        {
            auto const reg = static_cast<uint32_t>(t->in[k / 4]);
            auto const byte = static_cast<uint8_t>((reg >> (8 * (k & 3))) & 0xffU);
            int const row = g + (((k >> 2) & 1) ? 8 : 0);
            int const col = 4 * c + (k & 3) + (k >= 8 ? 16 : 0);
            A[row][col] = e4m3ToFloat(byte);
        }
        for (int k = 0; k < 8; ++k)
        {
            auto const reg = static_cast<uint32_t>(t->in[4 + k / 4]);
            auto const byte = static_cast<uint8_t>((reg >> (8 * (k & 3))) & 0xffU);
            B[4 * c + (k & 3) + (k >= 4 ? 16 : 0)][g] = e4m3ToFloat(byte);
        }
        for (int k = 0; k < 4; ++k)
        {
            C[g + (k >= 2 ? 8 : 0)][2 * c + (k & 1)] = bitsToFloat(static_cast<uint32_t>(t->in[6 + k]));
        }
    }
    ++gStats.mma;
    for (int i = 0; i < 32; ++i)
    {
        int const g = i >> 2;
        int const c = i & 3;
        for (int k = 0; k < 4; ++k)
        {
            int const m = g + (k >= 2 ? 8 : 0);
            int const n = 2 * c + (k & 1);
            double acc = C[m][n];
            for (int kk = 0; kk < 32; ++kk)
            {
                acc += static_cast<double>(A[m][kk]) * static_cast<double>(B[kk][n]);
            }
            lanes[i]->out[k] = floatToBits(static_cast<float>(acc));
        }
    }
}

void executeMma(Cta* cta, int warp, std::vector<Thread*> const& lanes)
{
    (void) cta;
    (void) warp;
    std::string const& op = parsePtx(lanes[0]->opText).opcode;
    if (op == "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32")
    {
        executeMmaE4m3(lanes);
        return;
    }
    if (!startsWith(op, "mma.sync.aligned.m16n8k16.row.col.f32."))
    {
        fault("unsupported mma shape or types: %s", op.c_str());
    }
    bool bf16;
    if (op == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
    {
        bf16 = true;
    }
    else if (op == "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    {
        bf16 = false;
    }
    else
    {
        fault("unsupported mma types: %s", op.c_str());
    }
    float A[16][16];
    float B[16][8];
    float C[16][8];
    for (int i = 0; i < 32; ++i)
    {
        Thread* t = lanes[i];
        int const g = i >> 2;
        int const c = i & 3;
        // A (16x16, row): a_k holds row g (+8 for k in {2,3,6,7}), column 2c + (k&1) (+8 for k >= 4).
        for (int k = 0; k < 8; ++k)
        {
            auto const reg = static_cast<uint32_t>(t->in[k / 2]);
            auto const h = static_cast<uint16_t>(k & 1 ? reg >> 16 : reg & 0xffffU);
            int const row = g + ((k & 2) ? 8 : 0);
            int const col = 2 * c + (k & 1) + (k >= 4 ? 8 : 0);
            A[row][col] = halfToFloat(h, bf16);
        }
        // B (16x8, col): b_k holds row (k index) 2c + (k&1) (+8 for k >= 2), column g.
        for (int k = 0; k < 4; ++k)
        {
            auto const reg = static_cast<uint32_t>(t->in[4 + k / 2]);
            auto const h = static_cast<uint16_t>(k & 1 ? reg >> 16 : reg & 0xffffU);
            B[2 * c + (k & 1) + (k >= 2 ? 8 : 0)][g] = halfToFloat(h, bf16);
        }
        // C (16x8): c_k holds row g (+8 for k >= 2), column 2c + (k&1).
        for (int k = 0; k < 4; ++k)
        {
            C[g + (k >= 2 ? 8 : 0)][2 * c + (k & 1)] = bitsToFloat(static_cast<uint32_t>(t->in[6 + k]));
        }
    }
    ++gStats.mma;
    float D[16][8];
    for (int m = 0; m < 16; ++m)
    {
        for (int n = 0; n < 8; ++n)
        {
            double acc = C[m][n];
            for (int k = 0; k < 16; ++k)
            {
                acc += static_cast<double>(A[m][k]) * static_cast<double>(B[k][n]);
            }
            D[m][n] = static_cast<float>(acc);
        }
    }
    for (int i = 0; i < 32; ++i)
    {
        int const g = i >> 2;
        int const c = i & 3;
        for (int k = 0; k < 4; ++k)
        {
            lanes[i]->out[k] = floatToBits(D[g + (k >= 2 ? 8 : 0)][2 * c + (k & 1)]);
        }
    }
}

void cpAsync(PtxInstr const& ins, PtxOperand const* ops)
{
    Thread* t = gCurrent;
    if (ins.operands.size() < 3)
    {
        fault("cp.async: malformed operands");
    }
    auto const dstAddr = static_cast<uint32_t>(ops[ins.operands[0][0]].value);
    auto const* src = reinterpret_cast<unsigned char const*>(ops[ins.operands[1][0]].value);
    int const cpBytes = ins.operands[2].empty() ? static_cast<int>(ins.immediates[2])
                                                : static_cast<int>(ops[ins.operands[2][0]].value);
    int srcBytes = cpBytes;
    if (ins.operands.size() >= 4)
    {
        srcBytes = ins.operands[3].empty() ? static_cast<int>(ins.immediates[3])
                                           : static_cast<int>(static_cast<int32_t>(ops[ins.operands[3][0]].value));
    }
    if (cpBytes != 4 && cpBytes != 8 && cpBytes != 16)
    {
        fault("cp.async: copy size %d is not 4, 8 or 16", cpBytes);
    }
    if (srcBytes < 0 || srcBytes > cpBytes)
    {
        fault("cp.async: source size %d outside [0, %d]", srcBytes, cpBytes);
    }
    if (dstAddr % cpBytes != 0 || reinterpret_cast<uintptr_t>(src) % cpBytes != 0)
    {
        fault("cp.async: misaligned copy of %d bytes (shared 0x%x, global %p)", cpBytes, dstAddr, src);
    }
    unsigned char* dst = sharedFromAddress(dstAddr, cpBytes, "cp.async destination");
    if (srcBytes > 0)
    {
        checkGlobal(src, srcBytes, "cp.async source");
    }
    else if (findAllocation(src) == nullptr)
    {
        fault("cp.async with source size 0 from %s: the source must still be a valid global address",
            describeAddress(src).c_str());
    }
    ++gStats.copies;
    PendingCopy c{dst, src, cpBytes, srcBytes};
    if (gConfig.copyMode == kAT_ISSUE)
    {
        landCopy(c);
    }
    else
    {
        std::memset(dst, 0xFF, cpBytes); // in flight: NaN until the wait
        t->openGroup.push_back(c);
    }
}

void cpAsyncWait(size_t keep)
{
    Thread* t = gCurrent;
    while (t->groups.size() > keep)
    {
        for (auto const& c : t->groups.front())
        {
            landCopy(c);
        }
        t->groups.pop_front();
    }
}

} // namespace

// ---- entry points used by the kernels -----------------------------------------------------------
void syncThreads()
{
    Thread* t = gCurrent;
    Cta* cta = t->cta;
    WarpSlot const& ws = cta->warps[t->warp];
    if (ws.arrived != 0)
    {
        fault("__syncthreads while lanes 0x%08x of this warp wait at %s", ws.arrived, collectiveName(ws.op));
    }
    cta->atBarrier += 1;
    t->state = State::kBARRIER;
    if (cta->atBarrier == cta->live)
    {
        releaseBarrier(cta);
        // the releasing thread was enqueued too: give way so the order decides who runs next
        block();
        return;
    }
    block();
}

void syncWarp(uint32_t mask)
{
    arrive(Collective::kSYNCWARP, mask);
}

void maybeYield()
{
    if (gCurrent == nullptr || gConfig.order != kSCRAMBLED)
    {
        return;
    }
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (u(gRng) < gConfig.yieldProbability)
    {
        enqueueReady(gCurrent);
        block();
    }
}

static uint64_t shfl(Collective op, uint32_t mask, uint64_t v, int arg, int width)
{
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
    {
        fault("%s: width %d is not a power of two in [1, 32]", collectiveName(op), width);
    }
    Thread* t = gCurrent;
    t->in[0] = v;
    t->in[1] = static_cast<uint64_t>(arg);
    t->opArg = width;
    arrive(op, mask);
    return t->out[0];
}

uint64_t shflXor(uint32_t mask, uint64_t v, int laneMask, int width)
{
    return shfl(Collective::kSHFL_XOR, mask, v, laneMask, width);
}
uint64_t shflUp(uint32_t mask, uint64_t v, unsigned delta, int width)
{
    return shfl(Collective::kSHFL_UP, mask, v, static_cast<int>(delta), width);
}
uint64_t shflDown(uint32_t mask, uint64_t v, unsigned delta, int width)
{
    return shfl(Collective::kSHFL_DOWN, mask, v, static_cast<int>(delta), width);
}
uint64_t shflIdx(uint32_t mask, uint64_t v, int src, int width)
{
    return shfl(Collective::kSHFL_IDX, mask, v, src, width);
}

uint32_t ballot(uint32_t mask, bool pred)
{
    Thread* t = gCurrent;
    t->in[0] = pred ? 1 : 0;
    arrive(Collective::kBALLOT, mask);
    return static_cast<uint32_t>(t->out[0]) & mask;
}

uint32_t matchAny(uint32_t mask, uint64_t v)
{
    Thread* t = gCurrent;
    t->in[0] = v;
    arrive(Collective::kMATCH_ANY, mask);
    return static_cast<uint32_t>(t->out[0]);
}

void const* checkGlobal(void const* p, size_t bytes, char const* what)
{
    Allocation const* al = findAllocation(p);
    auto const a = reinterpret_cast<uintptr_t>(p);
    if (al == nullptr || a + bytes > reinterpret_cast<uintptr_t>(al->data) + al->bytes)
    {
        fault("%s of %zu bytes at %s is outside every global allocation", what, bytes, describeAddress(p).c_str());
    }
    return p;
}

void checkGlobalOrShared(void const* p, size_t bytes, char const* what)
{
    if (gCurrent != nullptr && inShared(gCurrent->cta->smem, static_cast<unsigned char const*>(p), bytes))
    {
        return;
    }
    checkGlobal(p, bytes, what);
}

void* dynamicSmem()
{
    return gCurrent->cta->smem->dynBase;
}

void* staticSmem(int site, size_t bytes, size_t align)
{
    SmemArena* a = gCurrent->cta->smem;
    auto it = a->sites.find(site);
    if (it != a->sites.end())
    {
        return it->second;
    }
    align = std::max<size_t>(align, 16);
    auto lo = reinterpret_cast<uintptr_t>(a->staticLo) - bytes;
    lo &= ~(static_cast<uintptr_t>(align) - 1);
    auto* p = reinterpret_cast<unsigned char*>(lo);
    if (p < a->map)
    {
        fault("static __shared__ arrays exceed the 48 KiB static limit");
    }
    size_t const used = static_cast<size_t>(a->staticTop() - p);
    if (used > kDEFAULT_SMEM)
    {
        fault("static __shared__ arrays (%zu bytes) exceed the 48 KiB static limit", used);
    }
    if (used + a->dynBytes > gLaunch->smemLimit)
    {
        fault("static (%zu B) + dynamic (%zu B) shared memory exceed the device's %zu B per block", used, a->dynBytes,
            gLaunch->smemLimit);
    }
    std::memset(p, 0xFF, a->staticLo - p);
    a->staticLo = p;
    a->staticUsed = used;
    a->sites.emplace(site, p);
    return p;
}

uint32_t cvtaShared(void const* p)
{
    SmemArena* a = gCurrent->cta->smem;
    auto const* c = static_cast<unsigned char const*>(p);
    if (!(c >= a->staticLo && c <= a->staticTop()) && !(c >= a->dynBase && c <= a->dynBase + a->dynBytes))
    {
        fault("__cvta_generic_to_shared of %p, which is not in the CTA's shared memory", p);
    }
    return static_cast<uint32_t>(c - a->map);
}

void ptxExec(char const* text, PtxOperand const* ops, int n)
{
    PtxInstr const& ins = parsePtx(text);
    for (auto const& operand : ins.operands)
    {
        for (int num : operand)
        {
            if (num < 0 || num >= n)
            {
                fault("PTX operand %%%d out of range in '%s'", num, text);
            }
        }
    }
    std::string const& op = ins.opcode;
    Thread* t = gCurrent;
    if (startsWith(op, "cp.async.commit_group"))
    {
        t->groups.push_back(std::move(t->openGroup));
        t->openGroup.clear();
        maybeYield();
        return;
    }
    if (startsWith(op, "cp.async.wait_group"))
    {
        long long const keep = ins.operands[0].empty() ? ins.immediates[0]
                                                       : static_cast<long long>(ops[ins.operands[0][0]].value);
        cpAsyncWait(static_cast<size_t>(keep));
        return;
    }
    if (startsWith(op, "cp.async.wait_all"))
    {
        t->groups.push_back(std::move(t->openGroup));
        t->openGroup.clear();
        cpAsyncWait(0);
        return;
    }
    if (startsWith(op, "cp.async.ca.shared.global") || startsWith(op, "cp.async.cg.shared.global"))
    {
        maybeYield();
        cpAsync(ins, ops);
        return;
    }
    if (startsWith(op, "ldmatrix.sync.aligned.m8n8.") && op.find(".shared.b16") != std::string::npos)
    {
        int const num = op.find(".x4") != std::string::npos ? 4 : (op.find(".x2") != std::string::npos ? 2 : 1);
        if (ins.operands.size() != 2 || static_cast<int>(ins.operands[0].size()) != num || ins.operands[1].size() != 1)
        {
            fault("ldmatrix: malformed operands in '%s'", text);
        }
        t->in[0] = ops[ins.operands[1][0]].value & 0xffffffffULL;
        arrive(Collective::kLDMATRIX, 0xffffffffU, text);
        for (int j = 0; j < num; ++j)
        {
            storeOut(ops[ins.operands[0][j]], t->out[j]);
        }
        return;
    }
    if (startsWith(op, "mma.sync.aligned."))
    {
        if (ins.operands.size() != 4 || ins.operands[0].size() != 4 || ins.operands[1].size() != 4
            || ins.operands[2].size() != 2 || ins.operands[3].size() != 4)
        {
            fault("mma: unsupported operand shape in '%s'", text);
        }
        for (int k = 0; k < 4; ++k)
        {
            t->in[k] = ops[ins.operands[1][k]].value & 0xffffffffULL;
        }
        for (int k = 0; k < 2; ++k)
        {
            t->in[4 + k] = ops[ins.operands[2][k]].value & 0xffffffffULL;
        }
        for (int k = 0; k < 4; ++k)
        {
            t->in[6 + k] = ops[ins.operands[3][k]].value & 0xffffffffULL;
        }
        arrive(Collective::kMMA, 0xffffffffU, text);
        for (int k = 0; k < 4; ++k)
        {
            storeOut(ops[ins.operands[0][k]], t->out[k]);
        }
        return;
    }
    fault("unsupported PTX instruction '%s'", op.c_str());
}

// ---- the launch ---------------------------------------------------------------------------------
namespace
{

struct sigaction gOldSegv;
struct sigaction gOldBus;
std::vector<unsigned char> gAltStack;

void onSegv(int sig, siginfo_t* info, void*)
{
    if (gInLaunch && gCurrent != nullptr)
    {
        auto const* addr = static_cast<unsigned char const*>(info->si_addr);
        Thread* t = gCurrent;
        std::string what;
        if (addr >= t->stack.map && addr < t->stack.lo())
        {
            what = "stack overflow of a thread (" + std::to_string(kSTACK_BYTES / 1024) + " KiB)";
        }
        else if (t->cta != nullptr && addr >= t->cta->smem->map && addr < t->cta->smem->map + t->cta->smem->mapBytes)
        {
            what = "out-of-bounds shared memory access at " + std::to_string(addr - t->cta->smem->map)
                + " in the CTA's shared window (static " + std::to_string(t->cta->smem->staticUsed) + " B, dynamic "
                + std::to_string(t->cta->smem->dynBytes) + " B)";
        }
        else
        {
            what = "illegal address: plain load or store at " + describeAddress(addr);
        }
        if (gFault.empty())
        {
            gFault = what + " at " + threadName(t);
        }
        siglongjmp(gFaultJmp, 1);
    }
    struct sigaction* old = sig == SIGSEGV ? &gOldSegv : &gOldBus;
    sigaction(sig, old, nullptr);
    raise(sig);
}

void installHandlers()
{
    if (gAltStack.empty())
    {
        gAltStack.resize(256 * 1024);
    }
    stack_t ss{};
    ss.ss_sp = gAltStack.data();
    ss.ss_size = gAltStack.size();
    sigaltstack(&ss, nullptr);
    struct sigaction sa{};
    sa.sa_sigaction = onSegv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &gOldSegv);
    sigaction(SIGBUS, &sa, &gOldBus);
}

void restoreHandlers()
{
    sigaction(SIGSEGV, &gOldSegv, nullptr);
    sigaction(SIGBUS, &gOldBus, nullptr);
}

void startCta(LaunchState& L, Cta* cta, int linear, int slot)
{
    LaunchConfig const& cfg = *L.cfg;
    cta->linear = linear;
    cta->bid.x = static_cast<unsigned>(linear % cfg.grid.x);
    cta->bid.y = static_cast<unsigned>(linear / cfg.grid.x % cfg.grid.y);
    cta->bid.z = static_cast<unsigned>(linear / (cfg.grid.x * cfg.grid.y));
    cta->smem = arenaFor(slot);
    resetArena(cta->smem, cfg.smem);
    cta->threads.resize(L.nthreads);
    cta->warps.assign((L.nthreads + 31) / 32, WarpSlot{});
    cta->live = L.nthreads;
    cta->atBarrier = 0;
    for (int i = 0; i < L.nthreads; ++i)
    {
        Thread& t = cta->threads[i];
        t.linear = i;
        t.lane = i % 32;
        t.warp = i / 32;
        t.cta = cta;
        t.coords.threadIdx = make_uint3(i % cfg.block.x, i / cfg.block.x % cfg.block.y, i / (cfg.block.x * cfg.block.y));
        t.coords.blockIdx = cta->bid;
        t.coords.blockDim = cfg.block;
        t.coords.gridDim = cfg.grid;
        t.state = State::kREADY;
        t.op = Collective::kNONE;
        t.openGroup.clear();
        t.groups.clear();
        initFiber(&t);
    }
    if (gConfig.order == kREVERSE)
    {
        for (int i = L.nthreads - 1; i >= 0; --i)
        {
            enqueueReady(&cta->threads[i]);
        }
    }
    else
    {
        for (int i = 0; i < L.nthreads; ++i)
        {
            enqueueReady(&cta->threads[i]);
        }
    }
    ++gStats.ctas;
    gStats.threads += L.nthreads;
}

} // namespace

cudaError_t launch(void const* kernel, LaunchConfig const& cfg, ThreadBody body, void* closure)
{
    ++gStats.launches;
    if (!gFault.empty())
    {
        gLastError = cudaErrorLaunchFailure; // a faulted context runs nothing more, like a GPU after a fault
        return gLastError;
    }
    uint64_t const nthreads = static_cast<uint64_t>(cfg.block.x) * cfg.block.y * cfg.block.z;
    uint64_t const nctas = static_cast<uint64_t>(cfg.grid.x) * cfg.grid.y * cfg.grid.z;
    DeviceSpec const& dev = kDEVICES[gDevice];
    if (nthreads == 0 || nthreads > 1024 || cfg.block.z > 64 || nctas == 0 || cfg.grid.y > 65535
        || cfg.grid.z > 65535 || cfg.grid.x > 2147483647U)
    {
        gLastError = cudaErrorInvalidConfiguration;
        return gLastError;
    }
    auto const attr = gMaxDynSmem.find(kernel);
    size_t const allowed = attr != gMaxDynSmem.end() ? static_cast<size_t>(attr->second) : kDEFAULT_SMEM;
    if (cfg.smem > std::max(allowed, kDEFAULT_SMEM) || cfg.smem > static_cast<size_t>(dev.smemOptin))
    {
        gLastError = cudaErrorInvalidValue; // too much dynamic shared memory for this kernel / device
        return gLastError;
    }
    LaunchState L;
    L.kernel = kernel;
    L.cfg = &cfg;
    L.body = body;
    L.closure = closure;
    L.nthreads = static_cast<int>(nthreads);
    L.smemLimit = static_cast<size_t>(dev.smemOptin);
    gLaunch = &L;

    std::vector<int> order(nctas);
    for (uint64_t i = 0; i < nctas; ++i)
    {
        order[i] = static_cast<int>(i);
    }
    if (gConfig.order == kREVERSE)
    {
        std::reverse(order.begin(), order.end());
    }
    else if (gConfig.order == kSCRAMBLED)
    {
        std::shuffle(order.begin(), order.end(), gRng);
    }
    int const resident = std::max(1, std::min<int>(gConfig.residentCtas, static_cast<int>(nctas)));
    std::vector<Cta*> slots(resident, nullptr);
    std::vector<Cta> ctaStorage(resident);
    size_t next = 0;

    installHandlers();
    gInLaunch = true;
    if (sigsetjmp(gFaultJmp, 1) == 0)
    {
        for (;;)
        {
            for (int s = 0; s < resident; ++s)
            {
                if (slots[s] != nullptr && slots[s]->live == 0)
                {
                    for (auto& t : slots[s]->threads)
                    {
                        if (!t.openGroup.empty() || !t.groups.empty())
                        {
                            // copies a thread never waited for still land (the GPU completes them)
                            gCurrent = &t;
                            for (auto const& c : t.openGroup)
                            {
                                landCopy(c);
                            }
                            cpAsyncWait(0);
                            gCurrent = nullptr;
                        }
                    }
                    slots[s] = nullptr;
                }
                if (slots[s] == nullptr && next < order.size())
                {
                    slots[s] = &ctaStorage[s];
                    startCta(L, slots[s], order[next++], s);
                }
            }
            Thread* t = nullptr;
            if (gConfig.order == kSCRAMBLED)
            {
                if (!L.readyPool.empty())
                {
                    std::uniform_int_distribution<size_t> pick(0, L.readyPool.size() - 1);
                    size_t const k = pick(gRng);
                    t = L.readyPool[k];
                    L.readyPool[k] = L.readyPool.back();
                    L.readyPool.pop_back();
                }
            }
            else if (!L.ready.empty())
            {
                t = L.ready.front();
                L.ready.pop_front();
            }
            if (t == nullptr)
            {
                bool anyLive = false;
                int waitingBarrier = 0;
                int waitingWarp = 0;
                for (auto* c : slots)
                {
                    if (c == nullptr)
                    {
                        continue;
                    }
                    for (auto const& th : c->threads)
                    {
                        anyLive = anyLive || th.state != State::kDONE;
                        waitingBarrier += th.state == State::kBARRIER;
                        waitingWarp += th.state == State::kWARP;
                    }
                }
                if (!anyLive && next >= order.size())
                {
                    break; // every CTA has finished
                }
                if (!anyLive)
                {
                    continue;
                }
                if (gFault.empty())
                {
                    char buf[256];
                    std::snprintf(buf, sizeof(buf),
                        "deadlock: %d threads wait at __syncthreads and %d at warp collectives, none can proceed",
                        waitingBarrier, waitingWarp);
                    gFault = buf;
                }
                break;
            }
            if (t->state != State::kREADY)
            {
                continue; // stale entry
            }
            switchTo(t);
        }
    }
    gInLaunch = false;
    gCurrent = nullptr;
    gCoords = nullptr;
    restoreHandlers();
    // return stacks to the pool
    for (auto& c : ctaStorage)
    {
        for (auto& t : c.threads)
        {
            if (t.stack.map != nullptr)
            {
                gStackPool.push_back(t.stack);
                t.stack = Stack{};
            }
        }
    }
    gLaunch = nullptr;
    if (!gFault.empty())
    {
        gLastError = cudaErrorLaunchFailure;
        return gLastError;
    }
    return cudaSuccess;
}

} // namespace emu

// ---- CUDA runtime API (the calls the launchers and the C ABI make) ------------------------------
extern "C"
{

cudaError_t cudaGetLastError(void)
{
    cudaError_t const e = emu::gLastError;
    emu::gLastError = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return emu::gLastError;
}

char const* cudaGetErrorName(cudaError_t e)
{
    switch (e)
    {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorUnknown";
    }
}

char const* cudaGetErrorString(cudaError_t e)
{
    switch (e)
    {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulated kernel fault)";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "unknown error";
    }
}

cudaError_t cudaGetDevice(int* device)
{
    *device = emu::gDevice;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device)
{
    if (device < 0 || device >= emu::kNUM_DEVICES)
    {
        return cudaErrorInvalidDevice;
    }
    emu::DeviceSpec const& d = emu::kDEVICES[device];
    switch (attr)
    {
    case cudaDevAttrComputeCapabilityMajor: *value = d.major; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = d.minor; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = d.sms; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = d.smemOptin; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t cudaFuncSetAttribute(void const* func, enum cudaFuncAttribute attr, int value)
{
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize)
    {
        if (value < 0 || value > emu::kDEVICES[emu::gDevice].smemOptin)
        {
            return cudaErrorInvalidValue;
        }
        emu::gMaxDynSmem[func] = value;
    }
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t)
{
    if (count == 0)
    {
        return cudaSuccess;
    }
    emu::Allocation const* al = emu::findAllocation(ptr);
    if (al == nullptr || reinterpret_cast<uintptr_t>(ptr) + count > reinterpret_cast<uintptr_t>(al->data) + al->bytes)
    {
        if (emu::gFault.empty())
        {
            emu::gFault = "cudaMemsetAsync of " + std::to_string(count) + " bytes at " + emu::describeAddress(ptr)
                + " is outside every allocation";
        }
        return cudaErrorInvalidValue;
    }
    std::memset(ptr, value, count);
    return cudaSuccess;
}

// ---- the harness's C API ------------------------------------------------------------------------
__attribute__((visibility("default"))) int emu_configure(int order, int copyMode, unsigned long long seed,
    int residentCtas, double yieldProbability)
{
    if (order < 0 || order > 2 || copyMode < 0 || copyMode > 1 || residentCtas < 1)
    {
        return 1;
    }
    emu::gConfig.order = order;
    emu::gConfig.copyMode = copyMode;
    emu::gConfig.seed = seed;
    emu::gConfig.residentCtas = residentCtas;
    emu::gConfig.yieldProbability = yieldProbability;
    emu::gRng.seed(seed);
    return 0;
}

__attribute__((visibility("default"))) int emu_set_device(int device)
{
    if (device < 0 || device >= emu::kNUM_DEVICES)
    {
        return 1;
    }
    emu::gDevice = device;
    return 0;
}

__attribute__((visibility("default"))) char const* emu_device_name(int device)
{
    return device >= 0 && device < emu::kNUM_DEVICES ? emu::kDEVICES[device].name : "";
}

__attribute__((visibility("default"))) int emu_num_devices()
{
    return emu::kNUM_DEVICES;
}

//! A buffer whose end (guard_front == 0) or start (guard_front != 0) touches an inaccessible page,
//! with pattern bytes on the other side; 0 bytes gives NULL, as TensorRT passes for empty tensors.
__attribute__((visibility("default"))) void* emu_malloc(size_t bytes, int guardFront)
{
    if (bytes == 0)
    {
        return nullptr;
    }
    emu::gPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t const page = emu::gPage;
    size_t const padded = emu::roundUp(bytes, 16);
    size_t const body = emu::roundUp(padded + emu::kFRONT_GUARD + emu::kBACK_GUARD, page);
    size_t const mapBytes = body + 2 * page;
    void* m = mmap(nullptr, mapBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
    {
        return nullptr;
    }
    auto* map = static_cast<unsigned char*>(m);
    mprotect(map, page, PROT_NONE);
    mprotect(map + mapBytes - page, page, PROT_NONE);
    std::memset(map + page, emu::kGUARD_BYTE, body);
    emu::Allocation al{};
    al.id = emu::gNextAllocId++;
    al.map = map;
    al.mapBytes = mapBytes;
    al.bytes = bytes;
    if (guardFront)
    {
        al.data = map + page;
        al.frontGuard = 0;
        al.backGuard = body - bytes;
    }
    else
    {
        al.data = map + page + body - padded;
        al.frontGuard = body - padded;
        al.backGuard = padded - bytes;
    }
    std::memset(al.data, 0xFF, bytes); // uninitialised device memory reads as NaN
    emu::gAllocs.emplace(reinterpret_cast<uintptr_t>(al.data), al);
    return al.data;
}

__attribute__((visibility("default"))) int emu_free(void* p)
{
    auto it = emu::gAllocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == emu::gAllocs.end())
    {
        return 1;
    }
    munmap(it->second.map, it->second.mapBytes);
    emu::gAllocs.erase(it);
    return 0;
}

__attribute__((visibility("default"))) int emu_buffer_id(void const* p)
{
    auto it = emu::gAllocs.find(reinterpret_cast<uintptr_t>(p));
    return it == emu::gAllocs.end() ? -1 : it->second.id;
}

//! Checks the pattern bytes around every buffer; returns how many buffers were written outside.
__attribute__((visibility("default"))) int emu_check_guards()
{
    int bad = 0;
    for (auto const& kv : emu::gAllocs)
    {
        emu::Allocation const& al = kv.second;
        size_t before = 0;
        size_t after = 0;
        for (size_t i = 0; i < al.frontGuard; ++i)
        {
            before += al.data[-1 - static_cast<long>(i)] != emu::kGUARD_BYTE;
        }
        for (size_t i = 0; i < al.backGuard; ++i)
        {
            after += al.data[al.bytes + i] != emu::kGUARD_BYTE;
        }
        if (before + after > 0)
        {
            ++bad;
            if (emu::gFault.empty())
            {
                emu::gFault = "buffer #" + std::to_string(al.id) + " of " + std::to_string(al.bytes) + " bytes: "
                    + std::to_string(before) + " guard bytes before it and " + std::to_string(after)
                    + " after it were overwritten";
            }
        }
    }
    return bad;
}

__attribute__((visibility("default"))) char const* emu_fault()
{
    return emu::gFault.c_str();
}

__attribute__((visibility("default"))) void emu_clear_fault()
{
    emu::gFault.clear();
    emu::gLastError = cudaSuccess;
}

__attribute__((visibility("default"))) void emu_stats(unsigned long long* out6) // 7 counters
{
    out6[0] = emu::gStats.launches;
    out6[1] = emu::gStats.ctas;
    out6[2] = emu::gStats.threads;
    out6[3] = emu::gStats.switches;
    out6[4] = emu::gStats.collectives;
    out6[5] = emu::gStats.copies;
    out6[6] = emu::gStats.mma;
}

} // extern "C"
