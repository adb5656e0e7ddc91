/*
 * kernels/cuda/attention.cu — causal paged attention over a flattened
 * variable-length batch, on the tensor cores (mma.sync m16n8k16, bf16/f16
 * operands, float32 accumulation), with FlashAttention-2's online softmax
 * and flash-decoding's split-K.
 *
 * Work decomposition. The host cuts every sequence's query tokens into
 * tiles (loom_cuda_attn_tile). A CTA handles one (tile, kv head, key split):
 * its rows are the (token, query head) pairs of the tile that share the kv
 * head — token-major, row r = token tok0 + r / G, head kvh*G + r % G — so
 * K and V are read once for all G heads of a GQA group. Keys come straight
 * from the paged cache (the current chunk's K/V were written there by
 * loom_cuda_rope_kv), which is what makes chunked prefill and decode the
 * same code: a row at position p sees keys 0..p of its sequence.
 *
 * Two shapes of one kernel template <T, D, WM, BN, MINB, STAGES>, 4 warps:
 *   PREFILL (WM=4, BN=64): 64 rows, warp w owns rows 16w..16w+15, all warps
 *            walk the same 64-key tiles;
 *   DECODE  (WM=1, BN=16): 16 rows (a decode token x G heads), the 4 warps
 *            take different 16-key slices of each 64-key tile and their
 *            softmax states are merged at the end (intra-CTA split-K).
 * K/V tiles are staged in shared memory with cp.async (a ring of STAGES
 * tiles: 2 for prefill, 3 for decode, whose CTAs are few and only stream
 * memory), 16-byte chunks XOR-swizzled by row so ldmatrix reads are
 * conflict-free. S = Q K^T uses ldmatrix on K
 * rows, O += P V uses ldmatrix.trans on V rows; P is re-packed from the S
 * accumulators without touching shared memory.
 *
 * Split-K: a (tile, kv head) with kv_len keys is split into
 * ceil(kv_len / chunk) CTAs (loom_cuda_attn_split_plan; at most
 * max_splits, chunks of at least one stage — 64 keys — in the decode shape,
 * where a short context must still spread over many CTAs, and 256 keys in
 * the prefill shape). The split count is decided on the device from the
 * positions, so one captured CUDA graph serves any context length. Splits write normalised partial outputs and their
 * (max, sum) to the workspace and count themselves on a per-(tile, kv head)
 * semaphore; the last one to arrive merges all partials and writes the
 * output (and resets the semaphore to zero for the next launch), so split-K
 * costs no second kernel. A tile that needs one split writes directly.
 *
 * Batch invariance (loom_cuda_attention_invariant): a row's arithmetic is
 * fixed by the shape, its own position and its tile's split plan, and the
 * plan follows the tile's longest row and max_splits. With one token per
 * tile, one shape for every step and a constant max_splits, a (token,
 * head) row therefore gets the same bits in a decode step, inside a draft
 * verification or a prefill chunk, next to any other sequences, padded or
 * not: the key tiles, the warps' key slices, the split chunks and the
 * merge order (always splits 0, 1, ... whichever CTA finishes last) depend
 * on its kv length alone.
 *
 * Scheduling: CTAs take tiles in reverse order (the host lists each
 * sequence's tiles by ascending position, so the longest causal rows start
 * first and the partial last wave holds the short ones), and key tiles
 * entirely below every row's diagonal skip the mask arithmetic.
 *
 * Programmatic dependent launch (common.cuh): the kernel plans its splits
 * and reads its first block-table rows before griddepcontrol.wait — the
 * step's metadata, which no kernel writes — and Q and the cache after it.
 * Measured on an H200 (docs/gpu.md): 150 TFLOP/s for a
 * causal 2048-token prefill at head_dim 128, 78% of copy bandwidth for
 * decode over 32k contexts at batch 8.
 *
 * FP8 KV cache (template flag F8, loom_cuda_attn_args.kv = E4M3): K/V are
 * one-byte E4M3 codes (scale 1.0, the cpu backend's bits; e4m3.h). The
 * ring of STAGES then holds codes — cp.async moves half the bytes — and
 * each iteration, once its stage has landed, decodes it into one dt K tile
 * and one dt V tile laid out (swizzled) exactly like a dt stage, behind one
 * more barrier; the products, softmax, split-K and merge are the dt path's,
 * on the decoded values (exact: every code is a bf16 and an f16). The
 * decode is integer logic and one packed multiply per two elements
 * (common.cuh: lc_e4m3x4), no conversion-unit instruction. That is the
 * prefill shape (and head_dim 16 / 32 / 256), whose four warps share every
 * decoded K and V element.
 *
 * The decode shape over an E4M3 cache (lc_att_rd: head_dim 64 and 128)
 * converts codes in registers instead: no dt tiles, no extra barrier, and
 * 48 instead of 80 KiB of shared memory per CTA at head_dim 128, so 3 CTAs
 * fit an SM instead of 2
 * (the dt-tile design above ran at 34% of copy bandwidth at 512 sequences:
 * half the bytes per stage at the same occupancy). Each warp reads only its
 * own 16-key slice, so nothing is converted twice. The trick is a fixed
 * permutation of head_dim, free because a dot product does not care about
 * the order of its terms:
 *   S = Q K^T: in k16 step s, thread tq's B fragment holds the logical k
 *     indices 2tq, 2tq+1, 2tq+8, 2tq+9; they are taken from physical
 *     elements tq*D/4 + 4s + 0..3, so each thread reads one contiguous run
 *     of D/4 codes per key row, and Q's A fragment is gathered from global
 *     memory with the same map;
 *   O = P V: output column n of n8 tile j is physical element n*D/8 + j, so
 *     the B fragment of thread g (n = g) for every j is one run of D/8
 *     codes of a V row; two rows' bytes are interleaved with byte_perm into
 *     (key, key+1) pairs. The accumulators then hold columns in that order,
 *     and the merge reads them back through the inverse map.
 * Code stages are swizzled by row (16-byte chunk c of row r at
 * c ^ (r & 7)) so the reads are free of bank conflicts at head_dim 128; at
 * 64, V's 8-byte reads of rows 2tq meet 2-way.
 * Its products are f16 whatever dt is: the conversion unit turns each code
 * pair into an f16 pair (cvt.rn.f16x2.e4m3x2, common.cuh lc_e4m3x4_cvt: one
 * F2FP per two codes where lc_e4m3x4 takes about ten integer and packed
 * instructions per four: the key loop at head_dim 128, a warp's 16 keys x
 * 128 x K and V, is 618 SASS instructions instead of 873), and the mma
 * runs f16 x f16 -> f32. Exact where dt's was: a code is
 * an f16 value; a bf16 Q is converted once per CTA under a power of two
 * that puts the tile's largest |q| in [2^14, 2^15), below f16's 65504, and
 * comes back through the score scale (below), so every bf16 q down to
 * 2^-17 of the largest is exact in f16 and the products are the bf16
 * products times that power of two. P is rounded to f16 as p 2^15: 11
 * significant bits against bf16's 8 (only a p below 2^-29 is coarser, with
 * an absolute error under 2^-40; unshifted, every p under 2^-25 was lost,
 * up to N 2^-25 of a row's weight at N keys). Measured on the H200 against the integer
 * decode to dt with dt products (gpu_bench --attention, one run): 47.5 ->
 * 52.1% of copy bandwidth at 512 sequences of 256 keys, 63.1 -> 73.0% at
 * 512 of 1024, 60.6 -> 72.1% at 8 of 32k, 32.9 -> 36.6% at 1 of 32k.
 *
 * Sliding windows (loom_cuda_attn_args.window > 0, Gemma 3's local
 * layers): a row at position p sees keys p - window + 1 .. p. A tile's key
 * range then starts at its first row's window start, so keys no row sees
 * are never loaded (nor their blocks' table entries read: a windowed
 * block-table group may hold -1 there), the split plan covers only that
 * range, and key tiles that reach below some row's window take the masked
 * path.
 *
 * Head dim 256 (Gemma 3): the same kernel; its Q fragments and O
 * accumulators alone are 192 registers a thread, so both shapes are built
 * for one CTA an SM there, and the register-converting E4M3 decode path is
 * left to head dims up to 128 (256 stages its codes like the prefill shape).
 *
 * Not here: ALiBi, soft-capping, per-layer KV scales.
 * Head dims 16, 32, 64, 128, 256.
 */
#include "common.cuh"

#include <float.h>
#include <limits.h>
#include <math.h>

#include <type_traits>

#define LC_ATT_THREADS 128
/* Upper bound on splits per (tile, kv head). */
#define LC_SPLIT_MAX 64
/* kv_offsets' mark of a row not to load: no 16-byte chunk starts at an odd
 * element offset. */
#define LC_ATT_NO_ROW 0xFFFFFFFFu

/* ------------------------------------------------------- PTX wrappers */

__device__ __forceinline__ uint32_t lc_smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* 16-byte async copy global -> shared; zero-fills when !valid (no read). */
__device__ __forceinline__ void lc_cp_async16(uint32_t dst, const void *src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void lc_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void lc_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void lc_ldsm_x4(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void lc_ldsm_x2(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}
__device__ __forceinline__ void lc_ldsm_x4_t(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c (16x8 f32) += a (16x16) * b (16x8). */
template <typename T> __device__ __forceinline__ void lc_mma(float *c, const uint32_t *a, const uint32_t *b);
template <>
__device__ __forceinline__ void lc_mma<__nv_bfloat16>(float *c, const uint32_t *a,
                                                      const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void lc_mma<__half>(float *c, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* 2^x, approximate (the softmax runs in the log2 domain); 2^-inf = 0. */
__device__ __forceinline__ float lc_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Index (in 16-byte chunks) of chunk c of row `row` in a tile of CPR chunks
 * per row, XOR-swizzled so the 8 rows one ldmatrix reads hit distinct banks. */
template <int CPR> __device__ __forceinline__ int lc_swz(int row, int c) {
    constexpr int M = CPR >= 8 ? 7 : CPR - 1;
    return row * CPR + (c ^ (row & M));
}

/* ------------------------------------------------------------ split plan */

__host__ __device__ __forceinline__ void lc_split_plan(int kv_len, int max_splits, int cta_n,
                                                       int min_keys, int *splits, int *chunk) {
    int s = (kv_len + min_keys - 1) / min_keys;
    if (s > max_splits) s = max_splits;
    if (s > LC_SPLIT_MAX) s = LC_SPLIT_MAX;
    if (s < 1) s = 1;
    int c = (kv_len + s - 1) / s;
    c = ((c + cta_n - 1) / cta_n) * cta_n;
    if (c < cta_n) c = cta_n;
    *chunk = c;
    *splits = (kv_len + c - 1) / c;
    if (*splits < 1) *splits = 1;
}

template <int WM, int BN> struct lc_shape {
    static constexpr int NW = 4;
    static constexpr int WN = NW / WM;          /* warps along the keys      */
    static constexpr int ROWS = 16 * WM;        /* query rows per CTA        */
    static constexpr int CTA_N = BN * WN;       /* keys per shared-mem stage */
    static constexpr int SPLIT_MIN = WM == 1 ? CTA_N : 256; /* keys per split, at least */
};

typedef lc_shape<1, 16> lc_decode_shape;
typedef lc_shape<4, 64> lc_prefill_shape;

/* E4M3 codes converted in registers (the decode shape, head_dim >= 64):
 * see the file comment. */
__host__ __device__ constexpr bool lc_att_rd(bool f8, int wm, int d) { return f8 && wm == 1 && d >= 64 && d <= 128; }

/* Largest position + 1 among the tile's tokens (returned) and the first
 * key any of them sees (*k_lo: 0, or with a window the smallest position's
 * window start), computed by warp 0 and broadcast through `slot` (2 ints).
 * Every thread must call it. */
__device__ __forceinline__ int lc_tile_kv_len(const int32_t *__restrict__ positions,
                                              const loom_cuda_attn_tile &tile, int window, int *slot,
                                              int *k_lo) {
    if (threadIdx.x < 32) {
        int m = -1, lo = INT_MAX;
        for (int i = threadIdx.x; i < tile.ntok; i += 32) {
            const int p = positions[tile.tok0 + i];
            m = max(m, p), lo = min(lo, p);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
            lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        }
        if (threadIdx.x == 0) slot[0] = m + 1, slot[1] = window > 0 ? max(0, lo - window + 1) : 0;
    }
    __syncthreads();
    *k_lo = slot[1];
    return slot[0];
}

/* --------------------------------------------------------------- kernel */

/* grid (num_tiles, KVH, max_splits), block 128, dynamic smem lc_att_smem().
 * q (T, ldq) dt; out (T, ldo) dt; caches (num_blocks, KVH, bs, D) dt, or
 * E4M3 codes when F8; partial: see loom_cuda_attn_workspace_floats. */
template <typename T, bool F8, int D, int WM, int BN, int MINB, int STAGES>
__global__ void __launch_bounds__(LC_ATT_THREADS, MINB)
    lc_attn_kernel(const loom_cuda_attn_args a) {
    typedef lc_shape<WM, BN> S;
    constexpr int WN = S::WN, ROWS = S::ROWS, CTA_N = S::CTA_N;
    constexpr int CPR = D / 8;      /* 16-byte chunks per dt row  */
    constexpr int KSTEPS = D / 16;  /* k16 steps over head_dim    */
    constexpr int NT = BN / 8;      /* n8 tiles of S per warp     */
    constexpr int DT = D / 8;       /* n8 tiles of O per warp     */
    constexpr int OB_LD = D + 8;    /* padded row of the merge buffer (floats) */

    extern __shared__ uint4 lc_smem[];
    __shared__ int row_pos[ROWS];
    __shared__ float ml[WN][ROWS][2];
    __shared__ int s_kvlen[2], s_last;

    /* Up to lc_pdl_wait() this reads only the step's metadata — tiles,
     * positions, block table — which no kernel writes (loom_cuda_attn_args'
     * contract), so the split plan and the first stages' block-table reads
     * overlap the kernel before (RoPE + KV write). A CTA that leaves early
     * waits first, as every grid must not complete before the one it
     * follows. */
    const int ti = gridDim.x - 1 - blockIdx.x; /* longest tiles first */
    const loom_cuda_attn_tile tile = a.tiles[ti];
    if (tile.ntok <= 0) {
        lc_pdl_wait();
        return;
    }
    const int kvh = blockIdx.y, z = blockIdx.z;
    const int KVH = a.num_kv_heads, G = a.num_heads / a.num_kv_heads;
    const int bs = a.block_size;
    const int nrows = min(tile.ntok * G, ROWS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const T *__restrict__ q = static_cast<const T *>(a.q);
    /* caches as dt or as E4M3 codes (one of the pairs is used) */
    const T *__restrict__ kc = static_cast<const T *>(a.k_cache);
    const T *__restrict__ vc = static_cast<const T *>(a.v_cache);
    const uint8_t *__restrict__ kc8 = static_cast<const uint8_t *>(a.k_cache);
    const uint8_t *__restrict__ vc8 = static_cast<const uint8_t *>(a.v_cache);

    for (int r = tid; r < ROWS; r += LC_ATT_THREADS)
        row_pos[r] = r < nrows ? a.positions[tile.tok0 + r / G] : -1;
    int k_lo;
    const int kv_len = lc_tile_kv_len(a.positions, tile, a.window, s_kvlen, &k_lo); /* syncs */
    int splits, chunk;
    lc_split_plan(kv_len - k_lo, a.max_splits, CTA_N, S::SPLIT_MIN, &splits, &chunk);
    if (z >= splits) { /* uniform over the CTA */
        lc_pdl_wait();
        return;
    }
    const int k_begin = k_lo + z * chunk;
    const int k_end = min(kv_len, k_begin + chunk);
    const int n_iter = (k_end - k_begin + CTA_N - 1) / CTA_N;
    /* group g's table: (S, stride) rows at g * bt_stride[1] elements */
    const size_t bt_row0 = a.bt_group > 0 ? (size_t)a.bt_group * (size_t)a.bt_stride[1] : 0;
    const int32_t *__restrict__ bt = a.block_table + bt_row0 + (size_t)tile.seq * (size_t)(*a.bt_stride);

    /* shared memory, dt cache: K stages (STAGES, CTA_N, D) dt | V stages;
     * Q (ROWS <= CTA_N rows) borrows the last K stage, which is first
     * filled only after the Q fragments are in registers.
     * E4M3 cache (F8): the K and V tiles the products read (CTA_N, D) dt,
     * one each | K code stages (STAGES, CTA_N, D) bytes | V code stages;
     * cp.async fills the code stages, and each iteration decodes its stage
     * into the dt tiles (swizzled as a dt stage would be) before the
     * products; Q borrows the K tile, first written by iteration 0. */
    static_assert(ROWS <= CTA_N, "Q must fit in one K stage");
    static_assert(STAGES >= 2, "two stages at least");
    constexpr bool RD = lc_att_rd(F8, WM, D);
    /* RD's products are f16 (codes converted to f16 by the conversion
     * unit, a bf16 Q converted once, P in f16); the others' are dt */
    typedef typename std::conditional<RD, __half, T>::type MT;
    constexpr int TILES = RD ? 0 : F8 ? 1 : STAGES; /* dt tiles of K (and of V) */
    T *Ks = reinterpret_cast<T *>(lc_smem);
    T *Vs = Ks + TILES * CTA_N * D;
    T *Qs = Ks + (TILES > 0 ? TILES - 1 : 0) * CTA_N * D; /* unused when RD */
    uint8_t *K8 = reinterpret_cast<uint8_t *>(Vs + TILES * CTA_N * D); /* F8 only */
    uint8_t *V8 = K8 + STAGES * CTA_N * D;
    const uint32_t q_s = lc_smem_u32(Qs), k_s = lc_smem_u32(Ks), v_s = lc_smem_u32(Vs);

    /* K/V rows [kb, kb + CTA_N) -> stage st, through the block table.
     * Thread tid always copies chunk c = tid % CPRG of rows j0 + i * JSTEP, so
     * its shared-memory offsets are fixed and its global offsets need one
     * block-table read and a multiply-add per row; a power-of-two block size
     * (the usual 16) replaces the division by a shift. Element offsets fit
     * 32 bits (a pool of up to 4 G elements). dt stages are swizzled for
     * ldmatrix; code stages are plain rows of D bytes (read linearly by the
     * decode below). */
    constexpr int EB = F8 ? 1 : 2;              /* bytes per cache element   */
    constexpr int ROWB = D * EB;                /* bytes per staged row      */
    constexpr int CPRG = ROWB / 16;             /* 16-byte chunks per row    */
    constexpr int JSTEP = LC_ATT_THREADS / CPRG; /* rows per pass */
    constexpr int NPASS = (CTA_N + JSTEP - 1) / JSTEP; /* JSTEP > CTA_N: F8, D 16 */
    const int c_ld = tid % CPRG, j0 = tid / CPRG;
    /* RD code stages: chunk c of row r at c ^ (r & SWM) */
    constexpr int SWM = (CPRG < 8 ? CPRG : 8) - 1;
    /* row j0 + i*JSTEP adds i*JSTEP*ROWB (JSTEP is a multiple of the swizzle period) */
    const uint32_t s_off0 = RD   ? (uint32_t)(j0 * ROWB + ((c_ld ^ (j0 & SWM)) * 16))
                            : F8 ? (uint32_t)(j0 * ROWB + c_ld * 16)
                                 : (uint32_t)lc_swz<CPR>(j0, c_ld) * 16;
    const uint32_t blk_elems = (uint32_t)KVH * bs * D;
    const uint32_t head_off = (uint32_t)kvh * bs * D + c_ld * (16 / EB);
    const int bs_shift = (bs & (bs - 1)) == 0 ? __ffs(bs) - 1 : -1;
    const uint32_t kst_s = F8 ? lc_smem_u32(K8) : k_s, vst_s = F8 ? lc_smem_u32(V8) : v_s;
    /* The element offset of each of this thread's rows of the key tile at
     * kb (block-table reads only), LC_ATT_NO_ROW past k_end or the tile. */
    auto kv_offsets = [&](int kb, uint32_t (&e)[NPASS]) {
#pragma unroll
        for (int i = 0; i < NPASS; i++) {
            const int key = kb + j0 + i * JSTEP;
            e[i] = LC_ATT_NO_ROW;
            if ((NPASS * JSTEP > CTA_N && j0 + i * JSTEP >= CTA_N) || key >= k_end) continue;
            int blk, off;
            if (bs_shift >= 0) blk = bt[key >> bs_shift], off = key & (bs - 1);
            else blk = bt[key / bs], off = key % bs;
            e[i] = (uint32_t)blk * blk_elems + head_off + (uint32_t)off * D;
        }
    };
    auto issue_kv = [&](int st, const uint32_t (&eo)[NPASS]) {
        const uint32_t sbase = st * CTA_N * ROWB + s_off0;
#pragma unroll
        for (int i = 0; i < NPASS; i++) {
            if (NPASS * JSTEP > CTA_N && j0 + i * JSTEP >= CTA_N) break;
            const bool ok = eo[i] != LC_ATT_NO_ROW;
            const uint32_t e = ok ? eo[i] : 0u;
            /* a dt row of more than 16 chunks (head_dim 256): JSTEP = 4 rows,
             * less than the swizzle period, so each row's chunk is placed anew */
            const uint32_t so = !F8 && JSTEP % 8 != 0
                                    ? st * CTA_N * ROWB + (uint32_t)lc_swz<CPR>(j0 + i * JSTEP, c_ld) * 16
                                    : sbase + i * JSTEP * ROWB;
            if (F8) {
                lc_cp_async16(kst_s + so, kc8 + e, ok);
                lc_cp_async16(vst_s + so, vc8 + e, ok);
            } else {
                lc_cp_async16(kst_s + so, kc + e, ok);
                lc_cp_async16(vst_s + so, vc + e, ok);
            }
        }
    };
    auto load_kv = [&](int st, int kb) {
        uint32_t e[NPASS];
        kv_offsets(kb, e);
        issue_kv(st, e);
    };
    /* F8: decode code stage st into the dt tiles. Thread tid converts the
     * 8-code units u = tid + k * 128 (row u / CPR, dt chunk u % CPR): an
     * 8-byte read of consecutive codes (a warp reads 256 contiguous bytes)
     * and one 16-byte store to the chunk's swizzled place (a quarter warp
     * fills 8 distinct bank groups), both free of bank conflicts. */
    auto decode_kv = [&](int st) {
        const uint8_t *k8 = K8 + st * CTA_N * D, *v8 = V8 + st * CTA_N * D;
#pragma unroll
        for (int k = 0; k < CTA_N * CPR / LC_ATT_THREADS; k++) {
            const int u = tid + k * LC_ATT_THREADS;
            const int r = u / CPR, c = u % CPR;
            const uint2 kq = *reinterpret_cast<const uint2 *>(k8 + u * 8);
            const uint2 vq = *reinterpret_cast<const uint2 *>(v8 + u * 8);
            reinterpret_cast<uint4 *>(Ks)[lc_swz<CPR>(r, c)] = lc_e4m3x8<T>(kq);
            reinterpret_cast<uint4 *>(Vs)[lc_swz<CPR>(r, c)] = lc_e4m3x8<T>(vq);
        }
    };
    static_assert(CTA_N * CPR % LC_ATT_THREADS == 0, "whole decode passes");
    /* RD: byte `byte` of row `row` of a code stage at `stage` */
    auto code_at = [&](const uint8_t *stage, int row, int byte) -> const uint8_t * {
        return stage + row * ROWB + (((byte >> 4) ^ (row & SWM)) << 4) + (byte & 15);
    };
    /* prologue: stages 0 .. STAGES-2 in flight (one commit group each, empty
     * when past the range, so group counting stays uniform); their
     * block-table rows are read before the wait, Q and the cache after it:
     * the kernel before writes this step's keys, and with prefix caching a
     * block another sequence fills in this step may hold older keys of this
     * one (the paged cache registers full blocks at allocation) */
    uint32_t e_pro[STAGES - 1][NPASS];
#pragma unroll
    for (int sp = 0; sp < STAGES - 1; sp++)
        if (sp < n_iter) kv_offsets(k_begin + sp * CTA_N, e_pro[sp]);
    lc_pdl_trigger();
    lc_pdl_wait();
    /* Q rows -> shared (zero rows past nrows); RD reads Q straight into
     * registers below and commits an empty group here */
    for (int idx = tid; !RD && idx < ROWS * CPR; idx += LC_ATT_THREADS) {
        const int r = idx / CPR, c = idx % CPR;
        const bool ok = r < nrows;
        const T *src = ok ? q + (size_t)(tile.tok0 + r / G) * a.ldq + (size_t)(kvh * G + r % G) * D + c * 8
                          : q;
        lc_cp_async16(q_s + lc_swz<CPR>(r, c) * 16, src, ok);
    }
    lc_cp_async_commit();

#pragma unroll
    for (int sp = 0; sp < STAGES - 1; sp++) {
        if (sp < n_iter) issue_kv(sp, e_pro[sp]);
        lc_cp_async_commit();
    }

    /* Q fragments (A operand, 16 rows x D) stay in registers */
    lc_cp_async_wait<STAGES - 1>();
    __syncthreads();
    const int g = lane >> 2, tq = lane & 3;
    uint32_t qf[KSTEPS][4];
    float qscale = 1.0f; /* RD with a bf16 Q: the raw scores come out 2^-qs too small */
    if constexpr (RD) { /* rows g, g + 8; elements tq*D/4 + 4s + 0..3 for k step s */
        uint4 w[2][D / 32];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = g + 8 * h;
#pragma unroll
            for (int i = 0; i < D / 32; i++) w[h][i] = make_uint4(0u, 0u, 0u, 0u);
            if (r < nrows) {
                const uint4 *src = reinterpret_cast<const uint4 *>(
                    q + (size_t)(tile.tok0 + r / G) * a.ldq + (size_t)(kvh * G + r % G) * D + tq * (D / 4));
#pragma unroll
                for (int i = 0; i < D / 32; i++) w[h][i] = src[i];
            }
        }
        uint32_t *wv = reinterpret_cast<uint32_t *>(w);
        if constexpr (!std::is_same<T, __half>::value) {
            /* bf16 Q -> f16, exactly: every warp holds the whole 16-row Q
             * tile, so a warp max gives the tile's largest |q|, 2^E * 1.x;
             * Q * 2^-(E - 14) puts it in [2^14, 2^15) (f16's max is 65504),
             * where f16's 11-bit significand holds every bf16 value down to
             * 2^-17 of the largest (smaller ones round at f16's 2^-24
             * subnormal step: below 2^-40 of the largest |q|). The power of
             * two comes back through the score scale (sl2), which every
             * score passes through before the softmax (the batch-invariant
             * mode's tiles are one token: the power is that token's own). */
            uint32_t mx = 0;
#pragma unroll
            for (int i = 0; i < D / 4; i++) { /* both rows */
                const uint32_t m = wv[i] & 0x7fff7fffu;
                mx = max(mx, max(m & 0xffffu, m >> 16));
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const int e = (int)(mx >> 7); /* biased exponent; 255: inf / NaN, left as they are */
            const int qs = mx == 0 || e == 255 ? 0 : min(max(e - 127 - 14, -100), 100);
            const float down = __int_as_float((127 - qs) << 23);
            qscale = __int_as_float((127 + qs) << 23);
#pragma unroll
            for (int i = 0; i < D / 4; i++) {
                const __half2 hv = __floats2half2_rn(__uint_as_float(wv[i] << 16) * down,
                                                     __uint_as_float(wv[i] & 0xffff0000u) * down);
                wv[i] = *reinterpret_cast<const uint32_t *>(&hv);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++)
                qf[kk][h] = wv[h * (D / 8) + 2 * kk], qf[kk][2 + h] = wv[h * (D / 8) + 2 * kk + 1];
    } else {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
            const int r = wm * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            lc_ldsm_x4(qf[kk], q_s + lc_swz<CPR>(r, 2 * kk + (lane >> 4)) * 16);
        }
    }
    __syncthreads(); /* every warp has its Q: the last stage may be overwritten */

    const int rp0 = row_pos[wm * 16 + g], rp1 = row_pos[wm * 16 + g + 8];
    /* smallest position among this warp's valid rows: key tiles at or below
     * it need no causal mask (invalid rows are never written) */
    int rp_min = min(rp0 < 0 ? INT_MAX : rp0, rp1 < 0 ? INT_MAX : rp1);
    int rp_max = max(rp0, rp1); /* invalid rows are -1 */
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        rp_min = min(rp_min, __shfl_xor_sync(0xffffffffu, rp_min, off));
        rp_max = max(rp_max, __shfl_xor_sync(0xffffffffu, rp_max, off));
    }
    /* with a window, keys below win_lo are outside some row's window */
    const int win = a.window;
    const int win_lo = win > 0 ? rp_max - win + 1 : INT_MIN;
    const float sl2 = a.scale * 1.4426950408889634f * qscale; /* raw score -> log2 units */
    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int kw = wn * BN; /* this warp's key offset inside a stage */

    for (int it = 0; it < n_iter; it++) {
        const int st = it % STAGES;
        /* refill the slot computed at it - 1 (the barrier closing that
         * iteration made it free), keeping STAGES - 1 tiles in flight */
        if (it + STAGES - 1 < n_iter) load_kv((it + STAGES - 1) % STAGES, k_begin + (it + STAGES - 1) * CTA_N);
        lc_cp_async_commit();
        lc_cp_async_wait<STAGES - 1>(); /* tile `it` has landed */
        __syncthreads();
        if (F8 && !RD) {
            decode_kv(st); /* the dt tiles are free: the last iteration ended in a barrier */
            __syncthreads();
        }
        const uint8_t *k8s = K8 + st * CTA_N * ROWB, *v8s = V8 + st * CTA_N * ROWB; /* RD */
        const uint32_t ks = F8 ? k_s : k_s + st * CTA_N * CPR * 16;
        const uint32_t vs = F8 ? v_s : v_s + st * CTA_N * CPR * 16;

        /* S (16 x BN) = Q K^T */
        float sc[NT][4];
        if constexpr (RD) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) { /* key row kw + nt*8 + g, codes tq*D/4 .. +D/4 */
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const int kr = kw + nt * 8 + g;
            uint4 c[D / 64];
#pragma unroll
            for (int i = 0; i < D / 64; i++)
                c[i] = *reinterpret_cast<const uint4 *>(code_at(k8s, kr, tq * (D / 4) + 16 * i));
            const uint32_t *cw = reinterpret_cast<const uint32_t *>(c);
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++) {
                uint32_t b[2];
                lc_e4m3x4_cvt(cw[kk], &b[0], &b[1]);
                lc_mma<MT>(sc[nt], qf[kk], b);
            }
        }
        } else {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const int kr = kw + nt * 8 + (lane & 7);
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk += 2) {
                if (kk + 1 < KSTEPS) {
                    uint32_t b[4];
                    lc_ldsm_x4(b, ks + lc_swz<CPR>(kr, 2 * kk + (lane >> 3)) * 16);
                    lc_mma<MT>(sc[nt], qf[kk], b);
                    lc_mma<MT>(sc[nt], qf[kk + 1], b + 2);
                } else {
                    uint32_t b[2];
                    lc_ldsm_x2(b, ks + lc_swz<CPR>(kr, 2 * kk + ((lane >> 3) & 1)) * 16);
                    lc_mma<MT>(sc[nt], qf[kk], b);
                }
            }
        }
        }

        /* scale, causal + range mask (edge tiles only), running max */
        const int kbase = k_begin + it * CTA_N + kw;
        const bool edge = kbase + BN - 1 >= k_end || kbase + BN - 1 > rp_min || kbase < win_lo;
        const int key0 = kbase + 2 * tq;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float s = sc[nt][e]; /* raw q.k; scaled inside the exp below */
                if (edge) {
                    const int key = key0 + nt * 8 + (e & 1);
                    const int rp = e < 2 ? rp0 : rp1;
                    if (key >= k_end || key > rp || (win > 0 && key <= rp - win)) s = -INFINITY;
                }
                sc[nt][e] = s;
            }
            mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        /* running max in raw units (the scale is positive); a row with no
         * visible key yet keeps m = -inf and subtracts 0 */
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        /* P in f16 (MT) is taken as p 2^15 (the row's largest 32768, under
         * 65504), so a p down to 2^-29 keeps f16's 11 bits and none above
         * 2^-39 flushes to zero; l carries the same factor, which O / l and
         * the merges cancel */
        constexpr float p_shift = std::is_same<MT, __half>::value ? 15.0f : 0.0f;
        const float ms0 = (mn0 == -INFINITY ? 0.0f : mn0 * sl2) - p_shift;
        const float ms1 = (mn1 == -INFINITY ? 0.0f : mn1 * sl2) - p_shift;
        const float c0 = mn0 == -INFINITY ? 1.0f : lc_exp2((m0 - mn0) * sl2);
        const float c1 = mn1 == -INFINITY ? 1.0f : lc_exp2((m1 - mn1) * sl2);
        m0 = mn0, m1 = mn1;
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) { /* p = 2^(s * scale log2e - m) in one FFMA + EX2 */
            sc[nt][0] = lc_exp2(fmaf(sc[nt][0], sl2, -ms0));
            sc[nt][1] = lc_exp2(fmaf(sc[nt][1], sl2, -ms0));
            sc[nt][2] = lc_exp2(fmaf(sc[nt][2], sl2, -ms1));
            sc[nt][3] = lc_exp2(fmaf(sc[nt][3], sl2, -ms1));
            ps0 += sc[nt][0] + sc[nt][1];
            ps1 += sc[nt][2] + sc[nt][3];
        }
        l0 = l0 * c0 + ps0;
        l1 = l1 * c1 + ps1;
        if (c0 != 1.0f || c1 != 1.0f) { /* a row's max moved: rescale (rare once warm) */
#pragma unroll
            for (int d = 0; d < DT; d++) {
                o[d][0] *= c0, o[d][1] *= c0;
                o[d][2] *= c1, o[d][3] *= c1;
            }
        }

        /* O (16 x D) += P (16 x BN) V (BN x D) */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pa[4];
            pa[0] = lc_pack2<MT>(sc[2 * kk][0], sc[2 * kk][1]);
            pa[1] = lc_pack2<MT>(sc[2 * kk][2], sc[2 * kk][3]);
            pa[2] = lc_pack2<MT>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            pa[3] = lc_pack2<MT>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            if constexpr (RD) { /* rows r0, r0+1 (b0) and r0+8, r0+9 (b1); codes g*DT .. +DT */
                const int r0 = kw + 16 * kk + 2 * tq;
                alignas(16) uint32_t x[4][DT / 4];
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    const uint8_t *src = code_at(v8s, r0 + (h & 1) + 8 * (h >> 1), g * DT);
                    if constexpr (DT == 16) *reinterpret_cast<uint4 *>(x[h]) = *reinterpret_cast<const uint4 *>(src);
                    else *reinterpret_cast<uint2 *>(x[h]) = *reinterpret_cast<const uint2 *>(src);
                }
#pragma unroll
                for (int w = 0; w < DT / 4; w++) {
                    uint32_t b0[4], b1[4]; /* columns j = 4w .. 4w+3 */
                    lc_e4m3x4_cvt(__byte_perm(x[0][w], x[1][w], 0x5140), &b0[0], &b0[1]);
                    lc_e4m3x4_cvt(__byte_perm(x[0][w], x[1][w], 0x7362), &b0[2], &b0[3]);
                    lc_e4m3x4_cvt(__byte_perm(x[2][w], x[3][w], 0x5140), &b1[0], &b1[1]);
                    lc_e4m3x4_cvt(__byte_perm(x[2][w], x[3][w], 0x7362), &b1[2], &b1[3]);
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const uint32_t b[2] = {b0[j], b1[j]};
                        lc_mma<MT>(o[4 * w + j], pa, b);
                    }
                }
                continue;
            }
            const int vr = kw + 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int d = 0; d < DT; d += 2) {
                uint32_t b[4];
                lc_ldsm_x4_t(b, vs + lc_swz<CPR>(vr, d + (lane >> 4)) * 16);
                lc_mma<MT>(o[d], pa, b);
                lc_mma<MT>(o[d + 1], pa, b + 2);
            }
        }
        __syncthreads(); /* the next iteration's load overwrites this stage */
    }

    /* row sums were partial per thread: reduce over the quad */
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }

    /* merge buffer (WN, ROWS, OB_LD) f32 over the (now idle) tiles */
    float *ob = reinterpret_cast<float *>(lc_smem);
    {
        const int r0 = wm * 16 + g;
        float *b0 = ob + ((size_t)wn * ROWS + r0) * OB_LD;
        float *b1 = b0 + 8 * OB_LD;
#pragma unroll
        for (int d = 0; d < DT; d++) {
            *reinterpret_cast<float2 *>(b0 + d * 8 + 2 * tq) = make_float2(o[d][0], o[d][1]);
            *reinterpret_cast<float2 *>(b1 + d * 8 + 2 * tq) = make_float2(o[d][2], o[d][3]);
        }
        if (tq == 0) { /* max in log2 units from here on */
            ml[wn][r0][0] = m0 * sl2, ml[wn][r0][1] = l0;
            ml[wn][r0 + 8][0] = m1 * sl2, ml[wn][r0 + 8][1] = l1;
        }
    }
    __syncthreads();

    T *out = static_cast<T *>(a.out);
    const size_t cta0 = ((size_t)ti * KVH + kvh) * a.max_splits, cta = cta0 + z;
    float *po = a.partial + cta * ROWS * D;
    float *pml_all = a.partial + (size_t)a.num_tiles * KVH * a.max_splits * ROWS * D;
    float *pml = pml_all + cta * ROWS * 2;
    for (int idx = tid; idx < nrows * CPR; idx += LC_ATT_THREADS) {
        const int r = idx / CPR, c = idx % CPR;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < WN; w++) M = fmaxf(M, ml[w][r][0]);
        float L = 0.0f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < WN; w++) {
                const float f = lc_exp2(ml[w][r][0] - M);
                L += ml[w][r][1] * f;
                const float *row = ob + ((size_t)w * ROWS + r) * OB_LD;
                if constexpr (RD) { /* physical element p sits at column (p % DT) * 8 + p / DT */
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        const int p = c * 8 + e;
                        acc[e] += row[(p % DT) * 8 + p / DT] * f;
                    }
                    continue;
                }
                const float4 *src = reinterpret_cast<const float4 *>(row + c * 8);
                const float4 x0 = src[0], x1 = src[1];
                acc[0] += x0.x * f, acc[1] += x0.y * f, acc[2] += x0.z * f, acc[3] += x0.w * f;
                acc[4] += x1.x * f, acc[5] += x1.y * f, acc[6] += x1.z * f, acc[7] += x1.w * f;
            }
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] *= inv;
        if (splits == 1) {
            const int t = tile.tok0 + r / G, h = kvh * G + r % G;
            lc_stg16(out + (size_t)t * a.ldo + (size_t)h * D + c * 8, lc_pack8<T>(acc));
        } else {
            float4 *dst = reinterpret_cast<float4 *>(po + (size_t)r * D + c * 8);
            dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
            if (c == 0) pml[2 * r] = M, pml[2 * r + 1] = L;
        }
    }
    if (splits == 1) return;

    /* split-K: the last split of this (tile, kv head) to finish merges */
    __threadfence(); /* this CTA's partial is visible before it is counted */
    __syncthreads();
    if (tid == 0) {
        int *sem = a.sem + (size_t)ti * KVH + kvh;
        const int prev = atomicAdd(sem, 1);
        s_last = prev == splits - 1;
        if (s_last) *sem = 0; /* every split has counted: reset for the next launch */
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence(); /* see the other splits' partials */
    for (int idx = tid; idx < nrows * CPR; idx += LC_ATT_THREADS) {
        const int r = idx / CPR, c = idx % CPR;
        float M = -INFINITY;
        for (int sp = 0; sp < splits; sp++) M = fmaxf(M, __ldcg(pml_all + ((cta0 + sp) * ROWS + r) * 2));
        float L = 0.0f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (M != -INFINITY) {
            for (int sp = 0; sp < splits; sp++) {
                const float *mlz = pml_all + ((cta0 + sp) * ROWS + r) * 2;
                const float f = __ldcg(mlz + 1) * lc_exp2(__ldcg(mlz) - M);
                L += f;
                const float4 *src = reinterpret_cast<const float4 *>(
                    a.partial + ((cta0 + sp) * ROWS + r) * D + c * 8);
                const float4 x0 = __ldcg(src), x1 = __ldcg(src + 1);
                acc[0] += x0.x * f, acc[1] += x0.y * f, acc[2] += x0.z * f, acc[3] += x0.w * f;
                acc[4] += x1.x * f, acc[5] += x1.y * f, acc[6] += x1.z * f, acc[7] += x1.w * f;
            }
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] *= inv;
        const int t = tile.tok0 + r / G, h = kvh * G + r % G;
        lc_stg16(out + (size_t)t * a.ldo + (size_t)h * D + c * 8, lc_pack8<T>(acc));
    }
}

/* ----------------------------------------------------------------- host */

template <bool F8, int D, int WM, int BN, int STAGES> static size_t lc_att_smem() {
    typedef lc_shape<WM, BN> S;
    /* dt: STAGES K and V tiles; F8: one dt K and V tile (none when codes are
     * converted in registers) + STAGES code stages of each */
    const size_t dt_tiles = lc_att_rd(F8, WM, D) ? 0 : (size_t)(2 * S::CTA_N) * D * 2;
    const size_t tiles = F8 ? dt_tiles + (size_t)(2 * STAGES * S::CTA_N) * D
                            : (size_t)(2 * STAGES * S::CTA_N) * D * 2;
    const size_t merge = (size_t)S::WN * S::ROWS * (D + 8) * sizeof(float);
    return tiles > merge ? tiles : merge;
}

/* Raise the kernel's dynamic shared-memory limit, once per device
 * (lc_smem_limit). */
template <typename T, bool F8, int D, int WM, int BN, int MINB, int STAGES>
static cudaError_t lc_att_prepare(size_t smem) {
    static unsigned long long done = 0;
    return lc_smem_limit(&done, (const void *)lc_attn_kernel<T, F8, D, WM, BN, MINB, STAGES>, smem);
}

template <typename T, bool F8, int D, int WM, int BN, int MINB, int STAGES>
static int lc_att_occupancy() {
    const size_t smem = lc_att_smem<F8, D, WM, BN, STAGES>();
    if (lc_att_prepare<T, F8, D, WM, BN, MINB, STAGES>(smem) != cudaSuccess) return 0;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, lc_attn_kernel<T, F8, D, WM, BN, MINB, STAGES>,
                                                      LC_ATT_THREADS, smem) != cudaSuccess)
        return 0;
    return n;
}

template <typename T, bool F8, int D, int WM, int BN, int MINB, int STAGES>
static cudaError_t lc_att_launch(const loom_cuda_attn_args *a, cudaStream_t s) {
    const size_t smem = lc_att_smem<F8, D, WM, BN, STAGES>();
    cudaError_t e = lc_att_prepare<T, F8, D, WM, BN, MINB, STAGES>(smem);
    if (e != cudaSuccess) return e;
    dim3 grid((unsigned)a->num_tiles, (unsigned)a->num_kv_heads, (unsigned)a->max_splits);
    return lc_launch(lc_attn_kernel<T, F8, D, WM, BN, MINB, STAGES>, grid, dim3(LC_ATT_THREADS), smem,
                     s, *a);
}

/* The two shapes' builds: decode 16 rows, 3 stages (two tiles in flight
 * while one is computed; 2 CTAs per SM at head_dim 128; over an E4M3
 * cache converted in registers 48 KiB a CTA, 3 CTAs per SM, which its
 * registers allow — 4 stages were 1-2% slower); prefill 64 rows,
 * 2 stages, registers for 2 CTAs per SM (no spills). A 2-stage decode ring
 * and a 3-CTA prefill build were slower (docs/performance.md, tried and
 * rejected). */
/* CTAs an SM is built for: head_dim 256 needs the registers of one. */
template <int D> constexpr int lc_minb_decode() { return D > 128 ? 1 : 3; }
template <int D> constexpr int lc_minb_prefill() { return D > 128 ? 1 : 2; }

template <typename T, bool F8, int D>
static cudaError_t lc_att_shape(const loom_cuda_attn_args *a, cudaStream_t s) {
    if (a->shape == LOOM_CUDA_ATTN_DECODE) return lc_att_launch<T, F8, D, 1, 16, lc_minb_decode<D>(), 3>(a, s);
    return lc_att_launch<T, F8, D, 4, 64, lc_minb_prefill<D>(), 2>(a, s);
}

template <typename T, bool F8>
static cudaError_t lc_att_dim(const loom_cuda_attn_args *a, cudaStream_t s) {
    switch (a->head_dim) {
    case 16: return lc_att_shape<T, F8, 16>(a, s);
    case 32: return lc_att_shape<T, F8, 32>(a, s);
    case 64: return lc_att_shape<T, F8, 64>(a, s);
    case 128: return lc_att_shape<T, F8, 128>(a, s);
    case 256: return lc_att_shape<T, F8, 256>(a, s);
    default: return cudaErrorInvalidValue;
    }
}

template <typename T, bool F8, int D> static int lc_occ_d(loom_cuda_attn_shape shape) {
    if (shape == LOOM_CUDA_ATTN_DECODE) return lc_att_occupancy<T, F8, D, 1, 16, lc_minb_decode<D>(), 3>();
    return lc_att_occupancy<T, F8, D, 4, 64, lc_minb_prefill<D>(), 2>();
}

template <typename T, bool F8> static int lc_occ_dim(loom_cuda_attn_shape shape, int d) {
    switch (d) {
    case 16: return lc_occ_d<T, F8, 16>(shape);
    case 32: return lc_occ_d<T, F8, 32>(shape);
    case 64: return lc_occ_d<T, F8, 64>(shape);
    case 128: return lc_occ_d<T, F8, 128>(shape);
    case 256: return lc_occ_d<T, F8, 256>(shape);
    default: return 0;
    }
}

extern "C" int loom_cuda_attn_ctas_per_sm(loom_cuda_dt dt, loom_cuda_kv kv,
                                          loom_cuda_attn_shape shape, int head_dim) {
    if (kv == LOOM_CUDA_KV_E4M3)
        return dt == LOOM_CUDA_F16 ? lc_occ_dim<__half, true>(shape, head_dim)
                                   : lc_occ_dim<__nv_bfloat16, true>(shape, head_dim);
    if (kv != LOOM_CUDA_KV_DT) return 0;
    return dt == LOOM_CUDA_F16 ? lc_occ_dim<__half, false>(shape, head_dim)
                               : lc_occ_dim<__nv_bfloat16, false>(shape, head_dim);
}

extern "C" int loom_cuda_attn_max_splits(int num_tiles, int num_kv_heads, int resident) {
    const long ctas = (long)num_tiles * num_kv_heads;
    if (ctas <= 0 || resident <= 0 || ctas >= resident) return 1;
    long ms = resident / ctas;
    return (int)(ms < 1 ? 1 : ms > LC_SPLIT_MAX ? LC_SPLIT_MAX : ms);
}

extern "C" int loom_cuda_attn_rows(loom_cuda_attn_shape shape) {
    return shape == LOOM_CUDA_ATTN_DECODE ? lc_decode_shape::ROWS : lc_prefill_shape::ROWS;
}

extern "C" size_t loom_cuda_attn_workspace_floats(loom_cuda_attn_shape shape, int num_tiles,
                                                  int num_kv_heads, int head_dim, int max_splits) {
    if (max_splits <= 1 || num_tiles <= 0) return 0;
    const size_t rows = (size_t)loom_cuda_attn_rows(shape);
    const size_t ctas = (size_t)num_tiles * num_kv_heads * max_splits;
    return ctas * rows * ((size_t)head_dim + 2);
}

extern "C" void loom_cuda_attn_split_plan(loom_cuda_attn_shape shape, int kv_len, int max_splits,
                                          int *splits, int *chunk) {
    if (shape == LOOM_CUDA_ATTN_DECODE)
        lc_split_plan(kv_len, max_splits, lc_decode_shape::CTA_N, lc_decode_shape::SPLIT_MIN,
                      splits, chunk);
    else
        lc_split_plan(kv_len, max_splits, lc_prefill_shape::CTA_N, lc_prefill_shape::SPLIT_MIN,
                      splits, chunk);
}

extern "C" loom_cuda_attn_shape loom_cuda_attn_invariant_shape(int group) {
    return group <= lc_decode_shape::ROWS ? LOOM_CUDA_ATTN_DECODE : LOOM_CUDA_ATTN_PREFILL;
}

extern "C" size_t loom_cuda_attn_invariant_ws_floats(int num_heads, int num_kv_heads, int head_dim) {
    const int G = num_kv_heads > 0 ? num_heads / num_kv_heads : 0;
    return loom_cuda_attn_workspace_floats(loom_cuda_attn_invariant_shape(G), 1, num_kv_heads,
                                           head_dim, LOOM_CUDA_ATTN_INVARIANT_SPLITS);
}

extern "C" cudaError_t loom_cuda_attention_invariant(const loom_cuda_attn_args *a, size_t ws_floats,
                                                     cudaStream_t s) {
    if (a->num_tiles <= 0) return cudaSuccess;
    const int G = a->num_kv_heads > 0 ? a->num_heads / a->num_kv_heads : 0;
    const size_t per_tile = loom_cuda_attn_invariant_ws_floats(a->num_heads, a->num_kv_heads, a->head_dim);
    if (G < 1 || per_tile == 0 || ws_floats < per_tile) return cudaErrorInvalidValue;
    const size_t fit = ws_floats / per_tile;
    const int per_launch = fit < (size_t)a->num_tiles ? (int)fit : a->num_tiles;
    loom_cuda_attn_args c = *a;
    c.shape = loom_cuda_attn_invariant_shape(G);
    c.max_splits = LOOM_CUDA_ATTN_INVARIANT_SPLITS;
    /* launches in stream order share the workspace and counters: each
     * waits for the one before (griddepcontrol.wait) before touching them */
    for (int t0 = 0; t0 < a->num_tiles; t0 += per_launch) {
        c.tiles = a->tiles + t0;
        c.num_tiles = a->num_tiles - t0 < per_launch ? a->num_tiles - t0 : per_launch;
        const cudaError_t e = loom_cuda_attention(&c, s);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

extern "C" cudaError_t loom_cuda_attention(const loom_cuda_attn_args *a, cudaStream_t s) {
    if (a->num_tiles <= 0) return cudaSuccess;
    const int G = a->num_kv_heads > 0 ? a->num_heads / a->num_kv_heads : 0;
    if (G < 1 || G * a->num_kv_heads != a->num_heads || G > loom_cuda_attn_rows(a->shape) ||
        a->max_splits < 1 || a->max_splits > 65535 || a->num_kv_heads > 65535 ||
        (a->max_splits > 1 && (!a->partial || !a->sem)) || a->window < 0 || a->bt_group < 0 ||
        (a->kv != LOOM_CUDA_KV_DT && a->kv != LOOM_CUDA_KV_E4M3))
        return cudaErrorInvalidValue;
    if (a->kv == LOOM_CUDA_KV_E4M3)
        return a->dt == LOOM_CUDA_F16 ? lc_att_dim<__half, true>(a, s) : lc_att_dim<__nv_bfloat16, true>(a, s);
    return a->dt == LOOM_CUDA_F16 ? lc_att_dim<__half, false>(a, s) : lc_att_dim<__nv_bfloat16, false>(a, s);
}

/* ------------------------------------------------------- E4M3 decode test */

/* out (n) dt <- codes (n), 8 a thread, with the kernels' decoder. */
template <typename T>
__global__ void lc_e4m3_decode_kernel(uint4 *__restrict__ out, const uint2 *__restrict__ codes, size_t n8) {
    lc_pdl_trigger();
    lc_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x)
        out[i] = lc_e4m3x8<T>(codes[i]);
}

extern "C" cudaError_t loom_cuda_e4m3_decode(loom_cuda_dt dt, void *out, const uint8_t *codes, size_t n,
                                             cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (n % 8) return cudaErrorInvalidValue;
    const size_t n8 = n / 8;
    const unsigned blocks = (unsigned)(n8 / 256 + 1 < 4096 ? n8 / 256 + 1 : 4096);
    cudaError_t e;
    LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_e4m3_decode_kernel<E>, dim3(blocks), dim3(256), 0, s,
                                            static_cast<uint4 *>(out), reinterpret_cast<const uint2 *>(codes),
                                            n8));
    return e;
}
