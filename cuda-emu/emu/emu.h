// A CPU emulation of the CUDA features tarfa's kernels use, so that cuda/kernels/
// runs unchanged on a machine without a GPU (CI) and its bits can be compared with the CPU
// decoder's. Every CUDA thread is an OS thread; a block's threads run together (blocks one after
// another); __syncthreads and __syncwarp are barriers; warp shuffles exchange through a per-warp
// array between two warp barriers. Arithmetic: the *_rn intrinsics are the IEEE-754 single
// operations (this file is compiled with -ffp-contract=off, so no multiply-add is fused behind our
// back) and __fmaf_rn is fmaf, as on the GPU.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <sys/mman.h>
#include <thread>
#include <vector>

struct dim3 {
    unsigned int x, y, z;
};
struct uint4 {
    unsigned int x, y, z, w;
} __attribute__((aligned(16)));
struct float4 {
    float x, y, z, w;
} __attribute__((aligned(16)));

struct TarfaEmuBlock {
    std::unique_ptr<std::barrier<>> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<unsigned int> exchange;  // 32 words per warp
    std::vector<unsigned char> shared;   // dynamic shared memory
};

inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local TarfaEmuBlock* tarfa_emu_block;

#define __global__
#define __device__
#define __forceinline__ inline
// A kernel's thread limit (a register budget for the GPU's compiler): nothing to do here.
#define __launch_bounds__(threads)
// Statically sized `__shared__ T name;` in a kernel: one per block. Blocks run one after another
// and launches one at a time (a lock), so a function-local static serves.
#define __shared__ static
#define TARFA_DYNAMIC_SHARED(type, name) type* name = (type*)tarfa_emu_block->shared.data()

inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
inline float __int_as_float(unsigned int v) { float f; std::memcpy(&f, &v, 4); return f; }
inline int __float_as_int(float f) { int v; std::memcpy(&v, &f, 4); return v; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __double2float_rn(double a) { return (float)a; }
inline long long __double_as_longlong(double d) { long long v; std::memcpy(&v, &d, 8); return v; }
inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
inline void __trap() { std::abort(); }
using std::fmaxf;
using std::fminf;
using std::isnan;
using std::rintf;

inline void __syncthreads() { tarfa_emu_block->block->arrive_and_wait(); }
inline void __syncwarp() { tarfa_emu_block->warps[threadIdx.x / 32]->arrive_and_wait(); }

inline unsigned int tarfa_emu_exchange(unsigned int v, int src_lane) {
    unsigned int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    auto* ex = &tarfa_emu_block->exchange[w * 32];
    ex[lane] = v;
    __syncwarp();
    unsigned int r = (src_lane >= 0 && src_lane < 32) ? ex[src_lane] : v;
    __syncwarp();
    return r;
}
template <class T>
inline T tarfa_emu_shfl(T v, int src_lane) {
    unsigned int u;
    std::memcpy(&u, &v, 4);
    u = tarfa_emu_exchange(u, src_lane);
    std::memcpy(&v, &u, 4);
    return v;
}
template <class T>
inline T __shfl_down_sync(unsigned int, T v, int d) {
    int lane = threadIdx.x % 32;
    return tarfa_emu_shfl(v, lane + d < 32 ? lane + d : lane);
}
template <class T>
inline T __shfl_xor_sync(unsigned int, T v, int d) {
    return tarfa_emu_shfl(v, (int)(threadIdx.x % 32) ^ d);
}
template <class T>
inline T __shfl_sync(unsigned int, T v, int src) {
    return tarfa_emu_shfl(v, src);
}

// cp.async: each copy is queued in its thread's current group and made when a wait leaves fewer
// groups in flight, so a kernel that reads a stage before waiting for it reads stale bytes here
// too (as it may on the GPU) and its test fails.
#define TARFA_CP_ASYNC 1
struct TarfaEmuCopy {
    void* dst;
    const void* src;
    unsigned long long group;
};
inline thread_local std::vector<TarfaEmuCopy> tarfa_emu_copies;
inline thread_local unsigned long long tarfa_emu_group = 0;
// At issue the destination is filled with NaNs (the GPU gives no guarantee what a slot holds
// while its copy is in flight), so a kernel that reuses a slot still being read reads NaNs here.
// Both addresses must be 16-byte aligned, the destination inside the block's shared memory.
inline void tarfa_cp_async16(void* dst, const void* src) {
    const std::vector<unsigned char>& sh = tarfa_emu_block->shared;
    unsigned char* d = (unsigned char*)dst;
    if ((uintptr_t)dst % 16 != 0 || (uintptr_t)src % 16 != 0 || d < sh.data() ||
        d + 16 > sh.data() + sh.size() - 16) {
        std::abort();
    }
    std::memset(dst, 0xff, 16);
    tarfa_emu_copies.push_back({dst, src, tarfa_emu_group});
}
inline void tarfa_cp_commit() { ++tarfa_emu_group; }
// Wait until at most N of this thread's newest committed groups are in flight (the copies not yet
// committed are not waited for, as on the GPU).
template <int N>
inline void tarfa_cp_wait() {
    std::vector<TarfaEmuCopy> left;
    for (const TarfaEmuCopy& c : tarfa_emu_copies) {
        if (c.group + N < tarfa_emu_group) {
            std::memcpy(c.dst, c.src, 16);
        } else {
            left.push_back(c);
        }
    }
    tarfa_emu_copies.swap(left);
}

// Programmatic dependent launch: launches here run one after another, so the wait has nothing
// to wait for; what is checked is that every thread of every engine kernel enters exactly once
// (a thread that never entered might read an earlier launch's output early on the GPU; one that
// entered twice is a kernel calling a helper that enters as well).
// And what a kernel may touch before entering: the engine's activations (every buffer it
// allocates rather than uploads: x, q/k/v, the KV caches, params, ids, ...) are registered here
// and made inaccessible (PROT_NONE) while a launch runs until its first thread enters, so a
// kernel that reads or writes one before tarfa_grid_enter dies of SIGSEGV (on the GPU it would
// read the launch before's output early). Weights (uploaded) and parameters stay readable.
#define TARFA_GRID_DEP 1
struct TarfaEmuRange {
    void* p;
    size_t n;
};
inline std::mutex tarfa_emu_guard_m;
inline std::vector<TarfaEmuRange> tarfa_emu_guarded;
inline bool tarfa_emu_locked = false;
// Lock (PROT_NONE) or unlock every guarded range; the caller holds tarfa_emu_guard_m.
inline void tarfa_emu_protect(bool lock) {
    for (const TarfaEmuRange& r : tarfa_emu_guarded) {
        if (mprotect(r.p, r.n, lock ? PROT_NONE : PROT_READ | PROT_WRITE) != 0) std::abort();
    }
    tarfa_emu_locked = lock;
}
inline thread_local int tarfa_emu_entered = 0;
inline void tarfa_grid_enter() {
    if (++tarfa_emu_entered != 1) std::abort();
    std::lock_guard<std::mutex> g(tarfa_emu_guard_m);
    if (tarfa_emu_locked) tarfa_emu_protect(false);
}

// A pool of worker threads, one per thread of the largest block yet (created once, reused):
// starting an OS thread per emulated thread per launch made the emulation slow.
struct TarfaEmuPool {
    std::mutex m;
    std::condition_variable go, done;
    std::vector<std::thread> workers;
    unsigned long long generation = 0;
    unsigned int block = 0, running = 0, grid_block = 0;
    TarfaEmuBlock* blk = nullptr;
    const std::function<void()>* body = nullptr;

    void ensure(unsigned int n) {
        while (workers.size() < n) {
            unsigned int t = (unsigned int)workers.size();
            workers.emplace_back([this, t] { work(t); });
            workers.back().detach();
        }
    }

    void work(unsigned int t) {
        unsigned long long seen = 0;
        for (;;) {
            std::unique_lock<std::mutex> lk(m);
            go.wait(lk, [&] { return generation != seen; });
            seen = generation;
            if (t >= block) continue;
            TarfaEmuBlock* b = blk;
            const std::function<void()>* f = body;
            unsigned int gb = grid_block, bs = block;
            lk.unlock();
            threadIdx = {t, 0, 0};
            blockIdx = {gb, 0, 0};
            blockDim = {bs, 1, 1};
            tarfa_emu_block = b;
            tarfa_emu_copies.clear();  // a thread starts a block with no copy in flight
            tarfa_emu_group = 0;
            tarfa_emu_entered = 0;
            (*f)();
            if (tarfa_emu_entered != 1) std::abort();
            // A thread that returned leaves its barriers: their later phases stop waiting for it.
            b->warps[t / 32]->arrive_and_drop();
            b->block->arrive_and_drop();
            lk.lock();
            if (--running == 0) done.notify_all();
        }
    }

    void run_block(unsigned int b, unsigned int n, TarfaEmuBlock* tb, const std::function<void()>& f) {
        ensure(n);
        std::unique_lock<std::mutex> lk(m);
        block = n;
        running = n;
        grid_block = b;
        blk = tb;
        body = &f;
        ++generation;
        go.notify_all();
        done.wait(lk, [&] { return running == 0; });
    }
};

// Bytes after a block's dynamic shared memory that must still hold their pattern when it ends.
#define TARFA_EMU_SHARED_GUARD 256u

// Run `body` as a grid of `grid` blocks of `block` threads with `shared` bytes of dynamic shared
// memory, at most `max_shared` (48 KiB, unless the host allowed the kernel more, as CUDA's
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES does). `block` must be a multiple of 32 (every
// launch of tarfa's is).
inline void tarfa_emu_launch(unsigned int grid, unsigned int block, unsigned int shared,
                             const std::function<void()>& body,
                             unsigned int max_shared = 48 * 1024) {
    static std::mutex one_launch_at_a_time;
    // Never destroyed: its detached workers wait on its condition variable until the process
    // ends, and destroying a condition variable with waiters blocks (glibc) at exit.
    static TarfaEmuPool* pool = new TarfaEmuPool;
    std::lock_guard<std::mutex> hold(one_launch_at_a_time);
    {
        std::lock_guard<std::mutex> g(tarfa_emu_guard_m);
        if (!tarfa_emu_guarded.empty()) tarfa_emu_protect(true);
    }
    // Blocks in descending order: a GPU runs them in any order, and a kernel that needs a
    // lower-numbered block to have run first (e.g. to read what it stores in the same launch)
    // must not pass here because ascending order happened to suit it.
    for (unsigned int b = grid; b-- > 0;) {
        TarfaEmuBlock blk;
        blk.block = std::make_unique<std::barrier<>>(block);
        for (unsigned int w = 0; w < block / 32; ++w) blk.warps.push_back(std::make_unique<std::barrier<>>(32));
        blk.exchange.assign(block, 0);
        if (shared > max_shared) std::abort();  // more than the block may take
        // The block's dynamic shared memory, then a guard the kernel must not write (a host
        // that asked for too little for what a kernel stores dies here, not by luck later).
        blk.shared.assign(shared + TARFA_EMU_SHARED_GUARD, 0);
        std::memset(blk.shared.data() + shared, 0xa5, TARFA_EMU_SHARED_GUARD);
        pool->run_block(b, block, &blk, body);
        for (unsigned int i = 0; i < TARFA_EMU_SHARED_GUARD; ++i)
            if (blk.shared[shared + i] != 0xa5) std::abort();  // a store past the launch's shared memory
    }
    std::lock_guard<std::mutex> g(tarfa_emu_guard_m);
    if (tarfa_emu_locked) tarfa_emu_protect(false);
}
