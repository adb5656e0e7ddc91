/*
 * plugins/backend/cuda/cuda_backend.c — the "cuda" backend component: a
 * Llama-family forward pass on one NVIDIA GPU (bf16/f16 storage, float32
 * accumulation), built from kernels/cuda and cuBLASLt.
 *
 * This file holds the descriptor and parameter table, instance lifetime
 * (one non-default stream, one cuBLASLt context per instance, so two
 * instances coexist in a process), memory reporting, the KV pools (one
 * cudaMalloc per layer for K and one for V, in loom/backend.h's layout, and
 * an optional pinned, device-mapped host pool for swapping) and the block
 * copies. Weight loading is in cuda_load.c, the forward pass in
 * cuda_forward.c.
 *
 * Quantizers (loom/quant.h): int8 W8A16 / W8A8, fp8, int4 and GGUF blocks
 * as stored (q4_0, q4_1, q4_k, q6_k, q8_0) run on kernels/cuda's quantized
 * linear layers (loom_cuda_qgemm_run; see docs/quantization.md). The KV
 * cache holds the compute type, or FP8 E4M3 when the cache manager asks for
 * fp8_e4m3 (a quantizer's `kv_cache: fp8`): one byte per element, e4m3(x)
 * with a fixed scale of 1.0 like the cpu backend's (loom_cuda_kv), so a
 * pool of the same bytes holds twice the tokens.
 *
 * What it refuses to be: a multi-GPU backend by itself: the tp executor
 * drives one instance per GPU through load_shard (cuda_load.c) and joins
 * them with NCCL collectives in forward (cuda_comm.c) — or, over its
 * threads communicator, several instances on one GPU for testing. Built
 * for sm_90a (Hopper) only.
 */
#include "cuda_backend.h"
#include "kv_groups.h"

#include <stdio.h>
#include <string.h>

#include <cuda.h>

static const char *const cb_dtype_choices[] = {"bf16", "f16", NULL};
static const char *const cb_partition_choices[] = {"first", "rest", NULL};
static const char *const cb_qlayout_choices[] = {"rows", "tiled", NULL};
static const char *const cb_moe_dispatch_choices[] = {"all_reduce", "all_to_all", NULL};

static const loom_param cb_params[] = {
    {.key = "device", .type = LOOM_PARAM_INT, .offset = offsetof(cuda_backend_config, device),
     .default_value = "0", .min = 0, .max = 1023, .doc = "CUDA device ordinal"},
    {.key = "dtype", .type = LOOM_PARAM_ENUM, .offset = offsetof(cuda_backend_config, dtype),
     .default_value = "bf16", .min = 1, .max = 0, .choices = cb_dtype_choices,
     .doc = "storage type of weights, activations and the KV cache (accumulation is float32); a "
            "quantizer's kv_cache: fp8 makes the KV cache FP8 E4M3 instead"},
    {.key = "cuda_graphs", .type = LOOM_PARAM_BOOL,
     .offset = offsetof(cuda_backend_config, cuda_graphs), .default_value = "true",
     .doc = "capture decode and draft-verification steps per batch bucket (up to max_graph_batch) as CUDA graphs and "
            "replay them; off also turns piecewise_graphs off"},
    {.key = "max_graph_batch", .type = LOOM_PARAM_INT,
     .offset = offsetof(cuda_backend_config, max_graph_batch), .default_value = "256", .min = 1,
     .max = CB_MAX_GRAPH_BATCH,
     .doc = "largest decode batch run through a CUDA graph (larger steps run eagerly), rounded down to a "
            "bucket (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, "
            "768, 896, 1024); the logits work buffers hold max(256, it) rows (at 1024 and a 128k "
            "vocabulary: 525 MB on the device and as much pinned on the host)"},
    {.key = "piecewise_graphs", .type = LOOM_PARAM_BOOL,
     .offset = offsetof(cuda_backend_config, piecewise_graphs), .default_value = "true",
     .doc = "steps that are not pure decode (prefill, mixed prefill + decode) of up to max_graph_tokens "
            "rows: pad the rows to a token bucket (1, 2, 4, 8, then multiples of 16) and replay everything "
            "but attention from graphs captured per bucket at kv_alloc, one per layer boundary (needs "
            "cuda_graphs; not with batch_invariant, nor on a tensor-parallel rank)"},
    {.key = "max_graph_tokens", .type = LOOM_PARAM_INT,
     .offset = offsetof(cuda_backend_config, max_graph_tokens), .default_value = "2048", .min = 1,
     .max = CB_MAX_GRAPH_TOKENS,
     .doc = "largest step (token rows) run through piecewise graphs; larger ones run eagerly"},
    {.key = "max_batched_tokens", .type = LOOM_PARAM_INT,
     .offset = offsetof(cuda_backend_config, max_batched_tokens), .default_value = "8192",
     .min = 1, .max = 1 << 20,
     .doc = "most query tokens one forward step may carry (sizes the device work buffers)"},
    {.key = "max_positions", .type = LOOM_PARAM_INT,
     .offset = offsetof(cuda_backend_config, max_positions), .default_value = "0", .min = 0,
     .max = 1 << 24,
     .doc = "positions covered by the RoPE table; 0 = the model's trained context length"},
    {.key = "batch_invariant", .type = LOOM_PARAM_BOOL,
     .offset = offsetof(cuda_backend_config, batch_invariant), .default_value = "false",
     .doc = "a token's logits bit-identical however many tokens share its step (decode, draft "
            "verification, graph padding): one attention tile per token with a fixed split-K "
            "bound, the GEMV at every batch size; slower prefill; one GPU only (docs/gpu.md)"},
    {.key = "qgemv_tc_min_rows", .type = LOOM_PARAM_INT,
     .offset = offsetof(cuda_backend_config, qgemv_tc_min_rows), .default_value = "0", .min = 0, .max = 9,
     .doc = "fewest rows (1..8) from which W8A8 / FP8 / INT4 linear layers run the tensor-core GEMV, not "
            "the CUDA-core one; 0 = the crossover measured on the H200 (2 rows W8A8 / FP8, 3 INT4), 9 = never"},
    {.key = "quant_layout", .type = LOOM_PARAM_ENUM, .offset = offsetof(cuda_backend_config, quant_layout),
     .default_value = "tiled", .min = 1, .max = 0, .choices = cb_qlayout_choices,
     .doc = "W8A16 / INT4 weights: tiled = repacked once at load into tensor-core tiles (in place) for one "
            "kernel at 1..qtiled_max_rows rows (kernels/cuda/qtiled.cu; through the engine on an H100, "
            "Llama-3-8B: INT4 batch 1 7% faster than rows, W8A16 batch 1 13% slower; both beat bf16 at 64 "
            "requests in flight, where rows measured 0.74x / 0.77x bf16 on the H200), rows = as uploaded (one-row GEMVs with RoPE + KV "
            "write and SwiGLU fused, qmma.cu, dequantize + cuBLASLt: W8A16 batch-1 decode); "
            "shapes that do not tile (N % 16, K % 128, int4 group % 64) stay rows, with the W8A16 / INT4 weights "
            "of their decoder layer"},
    {.key = "qtiled_max_rows", .type = LOOM_PARAM_INT, .offset = offsetof(cuda_backend_config, qtiled_max_rows),
     .default_value = "512", .min = 0, .max = 65536,
     .doc = "quant_layout tiled: most rows (M) the tiled kernel runs, above 256 in chunks of 256 rows that "
            "each read the weight; above it the tiled weight is dequantized for cuBLASLt (batch_invariant: "
            "the kernel at every M)"},
    {.key = "qtiled_wgmma_rows", .type = LOOM_PARAM_INT,
     .offset = offsetof(cuda_backend_config, qtiled_wgmma_rows), .default_value = "17", .min = 0, .max = 257,
     .doc = "quant_layout tiled: fewest rows (M) from which the tiled kernel runs its Hopper wgmma path "
            "(warpgroup MMA, 32..256-token tiles), below it the mma.sync one; 0 = never (batch_invariant: "
            "never)"},
    {.key = "qtiled_epilogues", .type = LOOM_PARAM_BOOL,
     .offset = offsetof(cuda_backend_config, qtiled_epilogues), .default_value = "true",
     .doc = "quant_layout tiled, one-token steps: RoPE + KV write and SwiGLU done in the tiled weights' "
            "K-split reduce where K is split (kernels/cuda/qtiled.cu), else as kernels of their own; the same "
            "bits. Also fuses SwiGLU into the gate|up GEMM before a tiled down projection, whatever its "
            "format. INT4 batch 1 2% faster on an H100 (docs/gpu.md)"},
    {.key = "trigger_first", .type = LOOM_PARAM_BOOL, .offset = offsetof(cuda_backend_config, trigger_first),
     .default_value = "false",
     .doc = "true = every kernel lets the next one launch before its griddepcontrol.wait (programmatic "
            "dependent launch), so several grids launch ahead; false = after the wait, at most one ahead. "
            "Device-wide: set before each step, instances sharing a GPU should agree. H100, one machine, TPOT "
            "true -> false: tiled INT4 batch 1 (8 Llama-3-8B layers) 0.930 -> 0.738 ms, Llama-3-8B bf16 "
            "batch 1 5.61 -> 5.53, batch 8 7.50 -> 7.41, SmolLM2 shape 0.680 -> 0.657, Qwen3-30B-A3B "
            "batch 1 3.363 -> 3.391"},
    {.key = "fp8_vec_rows", .type = LOOM_PARAM_INT, .offset = offsetof(cuda_backend_config, fp8_vec_rows),
     .default_value = "129", .min = 0, .max = 65536,
     .doc = "FP8 GEMMs with bf16 output above the GEMV's 8 rows: from calls of this many rows cuBLASLt "
            "applies the per-token / per-channel scales (one rounding), below a unit-scale GEMM and a scale "
            "pass, faster there (H200, one Llama-3-8B layer's linears: 125.7 vs 178.3 us at 16 rows, 139.8 "
            "vs 166.5 at 64, 151.7 vs 161.4 at 128; the scales in cuBLASLt at 2048: 799.2 vs 1053.2); f16 "
            "and f32 outputs (the LM head) keep the scales in cuBLASLt"},
    {.key = "step_split", .type = LOOM_PARAM_BOOL, .offset = offsetof(cuda_backend_config, step_split),
     .default_value = "false",
     .doc = "time each step's host phases (prep, launch, masks, emit, wait, out) per path and the GPU's busy "
            "span and idle gap before it (two CUDA events a step), logged at destroy; off: only the host / "
            "GPU-wait split, so a batch-1 step pays nothing for it"},
    {.key = "kv_groups", .type = LOOM_PARAM_BOOL, .offset = offsetof(cuda_backend_config, kv_groups),
     .default_value = "true",
     .doc = "propose block-table groups to the cache (Gemma 3: sliding-window layers' blocks freed behind the "
            "window, cache.sliding_window: auto); false: one table, every layer's whole history"},
    {.key = "sm_count", .type = LOOM_PARAM_INT, .offset = offsetof(cuda_backend_config, sm_count),
     .default_value = "0", .min = 0, .max = 1024,
     .doc = "run every kernel of this instance (CUDA graphs included) on a green context of this many "
            "SMs (a multiple of the device's partition granularity, 8 on Hopper); 0 = the whole GPU. "
            "Two engines of one process given complementary partitions (sm_partition) run side by side "
            "without taking SMs from each other (docs/disaggregation.md, one GPU)"},
    {.key = "sm_partition", .type = LOOM_PARAM_ENUM, .offset = offsetof(cuda_backend_config, sm_partition),
     .default_value = "first", .min = 1, .max = 0, .choices = cb_partition_choices,
     .doc = "with sm_count: first = the sm_count SMs split off the device, rest = the SMs that split "
            "leaves over (what a second engine with the same sm_count and first does not use)"},
    {.key = "moe_dispatch", .type = LOOM_PARAM_ENUM, .offset = offsetof(cuda_backend_config, moe_dispatch),
     .default_value = "all_reduce", .min = 1, .max = 0, .choices = cb_moe_dispatch_choices,
     .doc = "expert parallelism under the tp executor (mixtures of experts): all_reduce = every rank routes every "
            "token through its own experts and the block's all-reduce sums the ranks; all_to_all = each rank "
            "routes its slice of the tokens and sends each (token, expert) pair to the expert's owner and back "
            "(loom_comm.all_to_allv; the counts cross the host, so those steps run without CUDA graphs); "
            "docs/moe.md"},
    {.key = "moe_expert_gemm_rows", .type = LOOM_PARAM_INT,
     .offset = offsetof(cuda_backend_config, moe_expert_gemm_rows), .default_value = "1024", .min = 0,
     .max = 1 << 20,
     .doc = "mixtures of experts: an eager step (not captured in a graph) whose (token, expert) pairs average at "
            "least this many rows an expert reads the experts' row counts on the host and runs one cuBLASLt GEMM "
            "an expert instead of the grouped GEMM — few large experts, as Mixtral's ~2048 in an 8192-token step "
            "(hidden and expert widths of whole 256-byte rows); the grouped wgmma GEMM wins at 512 rows "
            "(Qwen3-30B-A3B's 512: its 256 GEMMs a layer are launch-bound; where between 512 and 2048 the two "
            "cross was not measured); 0 = never (docs/moe.md)"},
    {.key = "moe_wgmma_rows", .type = LOOM_PARAM_INT, .offset = offsetof(cuda_backend_config, moe_wgmma_rows),
     .default_value = "1", .min = 0, .max = 1 << 20,
     .doc = "mixtures of experts: a step whose (token, expert) pairs average at least this many rows an expert "
            "runs the grouped expert GEMMs on Hopper's warpgroup MMA (wgmma: 64 x 256 tiles, 128 x 256 from "
            "moe_wgmma_128_rows, one CTA an SM) "
            "instead of mma.sync (64 x 128 tiles); decided by the step's size, so graphs capture it too. "
            "1 (the default) = every grouped step with at least as many pairs as experts (Qwen3-30B-A3B's decode "
            "at 3-15 sequences keeps mma.sync): on an H100 1.3-1.6x mma.sync from 32 sequences and in "
            "prefill; 0 = never (docs/moe.md)"},
    {.key = "moe_wgmma_128_rows", .type = LOOM_PARAM_INT,
     .offset = offsetof(cuda_backend_config, moe_wgmma_128_rows), .default_value = "64", .min = 0, .max = 1 << 20,
     .doc = "mixtures of experts: a step on the wgmma expert GEMMs (moe_wgmma_rows) whose (token, expert) pairs "
            "average at least this many rows an expert takes 128-row tiles — each warpgroup 64 rows x 256 columns, "
            "each weight stage in shared memory read once for 128 rows instead of 64 — instead of 64-row tiles; "
            "decided by the step's size, so graphs capture it too. 64 (the default): on an H100 1.08-1.69x the "
            "64-row tiles in prefill and 1.19-1.22x in Mixtral's decode at 64 and 128 rows an expert, 0.99x "
            "at 32 (Qwen3-30B-A3B's decode at 512 sequences); 0 = never (docs/moe.md)"},
    {.key = NULL},
};

/* ---------------------------------------------------------------- helpers */

/* ------------------------------------------------------- green contexts */

/* sm_count > 0: make b->stream a stream of a green context holding
 * sm_count SMs (sm_partition first) or the SMs such a split leaves over
 * (rest), and set num_sms to what it holds. The driver entry points come
 * through the runtime (cudaGetDriverEntryPointByVersion), so the plugin
 * needs no libcuda at link time. A green context shares the primary
 * context's memory: pools, weights and buffers are allocated as usual,
 * only where the kernels run changes; a graph captured on the stream and
 * launched on it runs there too. */
typedef CUresult (*cb_pfn_get_dev)(CUdevice *, int);
typedef CUresult (*cb_pfn_get_res)(CUdevice, CUdevResource *, CUdevResourceType);
typedef CUresult (*cb_pfn_split)(CUdevResource *, unsigned int *, const CUdevResource *, CUdevResource *,
                                 unsigned int, unsigned int);
typedef CUresult (*cb_pfn_desc)(CUdevResourceDesc *, CUdevResource *, unsigned int);
typedef CUresult (*cb_pfn_green)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned int);
typedef CUresult (*cb_pfn_green_destroy)(CUgreenCtx);
typedef CUresult (*cb_pfn_green_stream)(CUstream *, CUgreenCtx, unsigned int, int);

static void *cb_driver_fn(const char *name) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12050, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return fn;
}

static void cb_mask_stream_destroy(cuda_backend *b) {
    if (b->mask_copied) cudaEventDestroy(b->mask_copied);
    if (b->mask_stream) cudaStreamDestroy(b->mask_stream);
    b->mask_copied = NULL;
    b->mask_stream = NULL;
}

static void cb_green_destroy(cuda_backend *b) {
    if (!b->green) return;
    cb_pfn_green_destroy destroy = (cb_pfn_green_destroy)cb_driver_fn("cuGreenCtxDestroy");
    if (destroy) destroy((CUgreenCtx)b->green);
    b->green = NULL;
}

static loom_status cb_green_stream(cuda_backend *b, loom_error *err) {
    const loom_host *h = b->host;
    const long long want = (long long)b->cfg.sm_count;
    const bool rest = b->cfg.sm_partition == 1;
    cb_pfn_get_dev get_dev = (cb_pfn_get_dev)cb_driver_fn("cuDeviceGet");
    cb_pfn_get_res get_res = (cb_pfn_get_res)cb_driver_fn("cuDeviceGetDevResource");
    cb_pfn_split split = (cb_pfn_split)cb_driver_fn("cuDevSmResourceSplitByCount");
    cb_pfn_desc gen_desc = (cb_pfn_desc)cb_driver_fn("cuDevResourceGenerateDesc");
    cb_pfn_green create = (cb_pfn_green)cb_driver_fn("cuGreenCtxCreate");
    cb_pfn_green_stream stream_create = (cb_pfn_green_stream)cb_driver_fn("cuGreenCtxStreamCreate");
    if (!get_dev || !get_res || !split || !gen_desc || !create || !stream_create || !cb_driver_fn("cuGreenCtxDestroy"))
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: sm_count %lld needs CUDA green contexts (driver 12.5 or newer); this "
                        "driver lacks them: use sm_count 0 (the whole GPU)", want);
    CUdevice dev;
    CUdevResource all, group, left;
    memset(&all, 0, sizeof all);
    memset(&group, 0, sizeof group);
    memset(&left, 0, sizeof left);
    CUresult r;
    const char *what = "cuDeviceGet";
    if ((r = get_dev(&dev, b->device)) != CUDA_SUCCESS) goto driver_fail;
    what = "cuDeviceGetDevResource";
    if ((r = get_res(dev, &all, CU_DEV_RESOURCE_TYPE_SM)) != CUDA_SUCCESS) goto driver_fail;
    const unsigned total = all.sm.smCount, minp = all.sm.minSmPartitionSize,
                   align = all.sm.smCoscheduledAlignment ? all.sm.smCoscheduledAlignment : 1;
    if (want < (long long)minp || want % align || want + (rest ? (long long)minp : 0) > (long long)total ||
        want >= (long long)total)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cuda: sm_count %lld is not a partition of device %d (%u SMs): it must be a "
                        "multiple of %u, at least %u%s, and below %u%s", want, b->device, total, align, minp,
                        rest ? " and leave at least that many over for sm_partition rest" : "", total,
                        " (0 = the whole GPU)");
    unsigned ngroups = 1;
    what = "cuDevSmResourceSplitByCount";
    if ((r = split(&group, &ngroups, &all, &left, 0, (unsigned)want)) != CUDA_SUCCESS) goto driver_fail;
    CUdevResource *use = rest ? &left : &group;
    if (ngroups != 1 || use->sm.smCount == 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cuda: splitting %lld of device %d's %u SMs gave %u group(s) of %u and %u left "
                        "over: no %s partition; choose another sm_count",
                        want, b->device, total, ngroups, group.sm.smCount, left.sm.smCount, rest ? "rest" : "first");
    CUdevResourceDesc desc;
    what = "cuDevResourceGenerateDesc";
    if ((r = gen_desc(&desc, use, 1)) != CUDA_SUCCESS) goto driver_fail;
    CUgreenCtx g;
    what = "cuGreenCtxCreate";
    if ((r = create(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM)) != CUDA_SUCCESS) goto driver_fail;
    b->green = g;
    CUstream s;
    what = "cuGreenCtxStreamCreate";
    if ((r = stream_create(&s, g, CU_STREAM_NON_BLOCKING, 0)) != CUDA_SUCCESS) {
        cb_green_destroy(b);
        goto driver_fail;
    }
    b->stream = (cudaStream_t)s;
    b->num_sms = (int)use->sm.smCount;
    h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "green context on device %d: %u of %u SMs (sm_count %lld, %s)",
           b->device, use->sm.smCount, total, want, rest ? "rest" : "first");
    return LOOM_OK;
driver_fail:
    return h->error(h->ctx, err, r == CUDA_ERROR_NOT_SUPPORTED ? LOOM_ERR_UNSUPPORTED : LOOM_ERR_DEVICE,
                    "backend cuda: sm_count %lld (%s): %s failed on device %d with CUresult %d",
                    want, rest ? "rest" : "first", what, b->device, (int)r);
}


loom_status cb_cuda_check(cuda_backend *b, loom_error *err, cudaError_t e, const char *what,
                          const char *file, int line) {
    if (e == cudaSuccess) return LOOM_OK;
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls are not blamed */
    loom_status code = e == cudaErrorMemoryAllocation ? LOOM_ERR_NOMEM : LOOM_ERR_DEVICE;
    const loom_host *h = b->host;
    return h->error(h->ctx, err, code, "backend cuda (device %d): %s failed at %s:%d: %s (%s)",
                    b->device, what, file, line, cudaGetErrorName(e), cudaGetErrorString(e));
}

void cb_graphs_reset(cuda_backend *b) {
    for (int q = 0; q < CB_GRAPH_MAX_Q; q++)
        for (int i = 0; i < CB_NUM_BUCKETS; i++) {
            if (b->graphs[q][i].exec) cudaGraphExecDestroy(b->graphs[q][i].exec);
            b->graphs[q][i].exec = NULL;
            b->graphs[q][i].tried = false;
        }
    for (int k = 0; k < CB_NUM_TOK_BUCKETS; k++) {
        cuda_piece_set *ps = &b->pieces[k];
        if (ps->exec) {
            for (int32_t i = 0; i <= b->nlayers; i++)
                if (ps->exec[i]) cudaGraphExecDestroy(ps->exec[i]);
            b->host->free(b->host->ctx, ps->exec);
        }
        ps->exec = NULL;
        ps->tried = false;
    }
}

/* KV element type asked by the cache manager: COUNT means "the backend's
 * default" (the compute type); the compute type and FP8 E4M3 are held.
 * Returns LOOM_DTYPE_COUNT for anything else. */
static loom_dtype cb_kv_resolve(const cuda_backend *b, loom_dtype dtype) {
    if (dtype == LOOM_DTYPE_COUNT || dtype == b->ldt) return b->ldt;
    if (dtype == LOOM_DTYPE_FP8_E4M3) return dtype;
    return LOOM_DTYPE_COUNT;
}

static double cb_mib(size_t n) { return (double)n / (1024.0 * 1024.0); }

/* --------------------------------------------------------------- lifetime */

static void cb_destroy(void *self);

static loom_status cb_create(const loom_host *host, const void *config, void **self,
                             loom_error *err) {
    if (!host || !self || host->struct_size < offsetof(loom_host, num_threads) + sizeof(void *)) {
        if (err) {
            err->code = LOOM_ERR_ABI;
            snprintf(err->message, sizeof err->message,
                     "backend cuda: create() needs a host table of at least %zu bytes (got %u)",
                     offsetof(loom_host, num_threads) + sizeof(void *),
                     host ? host->struct_size : 0u);
        }
        return LOOM_ERR_ABI;
    }
    *self = NULL;
    cuda_backend_config cfg = {.device = 0, .dtype = 0, .cuda_graphs = true,
                               .max_graph_batch = 256, .piecewise_graphs = true,
                               .max_graph_tokens = 2048, .max_batched_tokens = 8192,
                               .max_positions = 0, .batch_invariant = false, .qgemv_tc_min_rows = 0,
                               .quant_layout = 1, .qtiled_max_rows = 512, .qtiled_wgmma_rows = 17,
                               .qtiled_epilogues = true, .trigger_first = false,
                               .fp8_vec_rows = LOOM_CUDA_FP8_VEC_MIN_M,
                               .sm_count = 0, .sm_partition = 0, .kv_groups = true, .moe_dispatch = 0,
                               .moe_expert_gemm_rows = 1024,
                               .moe_wgmma_rows = 1, .moe_wgmma_128_rows = 64};
    if (config) memcpy(&cfg, config, sizeof cfg);
    if (cfg.device < 0 || cfg.dtype < 0 || cfg.dtype > 1 || cfg.max_graph_batch < 1 ||
        cfg.max_graph_batch > CB_MAX_GRAPH_BATCH || cfg.max_graph_tokens < 1 ||
        cfg.max_graph_tokens > CB_MAX_GRAPH_TOKENS || cfg.max_batched_tokens < 1 ||
        cfg.max_batched_tokens > (1 << 20) || cfg.max_positions < 0 || cfg.sm_count < 0 ||
        cfg.sm_partition < 0 || cfg.sm_partition > 1 || (cfg.sm_partition == 1 && cfg.sm_count == 0) ||
        cfg.moe_dispatch < 0 || cfg.moe_dispatch > 1)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "backend cuda: bad config (device %lld >= 0, dtype %lld in {0 bf16, "
                           "1 f16}, max_graph_batch %lld in [1, %d], max_graph_tokens %lld in [1, %d], "
                           "max_batched_tokens %lld in [1, 1048576], max_positions %lld >= 0, sm_count "
                           "%lld >= 0, sm_partition %lld in {0 first, 1 rest}, rest only with an sm_count, "
                           "moe_dispatch %lld in {0 all_reduce, 1 all_to_all})",
                           (long long)cfg.device, (long long)cfg.dtype,
                           (long long)cfg.max_graph_batch, CB_MAX_GRAPH_BATCH, (long long)cfg.max_graph_tokens,
                           CB_MAX_GRAPH_TOKENS, (long long)cfg.max_batched_tokens,
                           (long long)cfg.max_positions, (long long)cfg.sm_count, (long long)cfg.sm_partition,
                           (long long)cfg.moe_dispatch);

    /* a batch between two buckets pads to the upper one, which this bound
     * would exclude: keep the largest bucket it admits */
    for (int k = CB_NUM_BUCKETS - 1; k >= 0; k--)
        if (cb_buckets[k] <= cfg.max_graph_batch) {
            cfg.max_graph_batch = cb_buckets[k];
            break;
        }

    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0)
        return host->error(host->ctx, err, LOOM_ERR_DEVICE,
                           "backend cuda: no usable CUDA device (%s: %s); check the driver "
                           "(nvidia-smi) or use backend cpu",
                           e != cudaSuccess ? cudaGetErrorName(e) : "cudaGetDeviceCount",
                           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (cfg.device >= ndev)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "backend cuda: device %lld asked, this machine has %d (0..%d)",
                           (long long)cfg.device, ndev, ndev - 1);
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, (int)cfg.device)) != cudaSuccess)
        return host->error(host->ctx, err, LOOM_ERR_DEVICE,
                           "backend cuda: cudaGetDeviceProperties(%lld): %s",
                           (long long)cfg.device, cudaGetErrorString(e));
    if (prop.major != 9 || prop.minor != 0)
        return host->error(host->ctx, err, LOOM_ERR_UNSUPPORTED,
                           "backend cuda: device %lld (%s) is sm_%d%d, but this build carries "
                           "sm_90a code only (Hopper: H100/H200); rebuild with that architecture "
                           "in cuda_gencode (meson.build) or use backend cpu",
                           (long long)cfg.device, prop.name, prop.major, prop.minor);

    cuda_backend *b = host->calloc(host->ctx, 1, sizeof *b);
    if (!b)
        return host->error(host->ctx, err, LOOM_ERR_NOMEM,
                           "backend cuda: out of memory for the instance (%zu bytes)", sizeof *b);
    b->host = host;
    b->cfg = cfg;
    b->device = (int)cfg.device;
    b->dt = cfg.dtype == 1 ? LOOM_CUDA_F16 : LOOM_CUDA_BF16;
    b->ldt = cfg.dtype == 1 ? LOOM_DTYPE_F16 : LOOM_DTYPE_BF16;
    b->elt = 2;
    b->num_sms = prop.multiProcessorCount;
    snprintf(b->device_name, sizeof b->device_name, "%.127s", prop.name);
    loom_status st;
    if ((st = CB_CUDA(b, err, cudaSetDevice(b->device))) ||
        (st = cfg.sm_count > 0 ? cb_green_stream(b, err)
                               : CB_CUDA(b, err, cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)))) {
        cb_destroy(b);
        return st;
    }
    int code = 0;
    char msg[256] = "";
    b->gemm = loom_cuda_gemm_create((size_t)32 << 20, &code, msg, sizeof msg);
    if (!b->gemm) {
        cb_destroy(b);
        return host->error(host->ctx, err, code == 10000 + (int)cudaErrorMemoryAllocation
                                               ? LOOM_ERR_NOMEM : LOOM_ERR_DEVICE,
                           "backend cuda: cuBLASLt setup on device %lld: %s",
                           (long long)cfg.device, msg);
    }
    host->log(host->ctx, LOOM_LOG_INFO, CB_WHO, "device %d: %s, %d SMs, %.1f GiB; %s, graphs %s%s%s",
              b->device, prop.name, prop.multiProcessorCount,
              (double)prop.totalGlobalMem / (1u << 30), cb_dtype_choices[cfg.dtype],
              cfg.cuda_graphs ? "on" : "off",
              cfg.cuda_graphs && cfg.piecewise_graphs && !cfg.batch_invariant ? " (piecewise too)" : "",
              cfg.batch_invariant ? ", batch-invariant" : "");
    *self = b;
    return LOOM_OK;
}

static void cb_destroy(void *self) {
    cuda_backend *b = self;
    if (!b) return;
    const loom_host *h = b->host;
    if (b->steps_timed > 0)
        h->log(h->ctx, LOOM_LOG_INFO, CB_WHO,
               "%lld steps (%lld from decode graphs, %lld piecewise): %.3f ms a step, of which %.3f ms waiting for the GPU "
               "and %.3f ms host work (metadata, launches, copies out)",
               (long long)b->steps_timed, (long long)b->graph_replays, (long long)b->piecewise_replays,
               1e3 * b->step_seconds / (double)b->steps_timed,
               1e3 * b->wait_seconds / (double)b->steps_timed,
               1e3 * (b->step_seconds - b->wait_seconds) / (double)b->steps_timed);
    if (b->moe_lt_layers > 0)
        h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "%lld expert layers ran one cuBLASLt GEMM an expert (moe_expert_gemm_rows)",
               (long long)b->moe_lt_layers);
    static const char *const path_names[CB_PATHS] = {"decode graphs", "piecewise", "eager"};
    for (int k = 0; k < CB_PATHS && b->cfg.step_split; k++) {
        const int64_t n = b->path_steps[k];
        if (n == 0) continue;
        const double *ph = b->ph[k], f = 1e3 / (double)n;
        h->log(h->ctx, LOOM_LOG_INFO, CB_WHO,
               "%s: %lld steps, ms a step: prep %.3f, launch %.3f, masks %.3f, emit %.3f, wait %.3f, out %.3f, "
               "capture %.3f; GPU %.3f busy from the first upload to the last launch, %.3f idle before the step; "
               "%lld steps starved (the GPU done before the host finished launching)",
               path_names[k], (long long)n, f * ph[CB_PH_PREP], f * ph[CB_PH_LAUNCH], f * ph[CB_PH_MASK],
               f * ph[CB_PH_EMIT], f * ph[CB_PH_WAIT], f * ph[CB_PH_OUT], f * ph[CB_PH_CAPTURE],
               f * b->gpu_busy[k], f * b->gpu_gap[k], (long long)b->starved[k]);
    }
    if (b->steps_timed > 0 && b->gemm) {
        long long made = 0;
        double secs = 0;
        loom_cuda_gemm_plan_stats(b->gemm, &made, &secs);
        h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "cuBLASLt plans made (cache misses): %lld, %.3f s of host time", made,
               secs);
    }
    if (b->mask_steps > 0)
        h->log(h->ctx, LOOM_LOG_INFO, CB_WHO,
               "constraint masks in %lld steps: %.3f ms a step computing them beside the GPU (counted as host work "
               "above); in %lld of those steps the GPU was done before the masks",
               (long long)b->mask_steps, 1e3 * b->mask_seconds / (double)b->mask_steps, (long long)b->mask_late);
    cudaSetDevice(b->device);
    if (b->stream) cudaStreamSynchronize(b->stream);
    if (b->ev_start) cudaEventDestroy(b->ev_start);
    if (b->ev_end) cudaEventDestroy(b->ev_end);
    if (b->ev_prev_end) cudaEventDestroy(b->ev_prev_end);
    cb_graphs_reset(b);
    if (b->pools) {
        for (int32_t i = 0; i < 2 * b->kv_npools; i++)
            if (b->pools[i]) cudaFree(b->pools[i]);
        h->free(h->ctx, b->pools);
    }
    cudaFree(b->pools_dev);
    cudaFree(b->swap_dev);
    if (b->swap) cudaFreeHost(b->swap);
    cudaFree(b->pairs_dev);
    cudaFree(b->img_stage);
    cudaFree(b->img_ptrs_dev);
    cudaFree(b->img_pairs_dev);
    cudaFree(b->work);
    cudaFree(b->moe_work);
    cudaFree(b->moe_qwork);
    cb_moe_ep_free(b);
    cudaFree(b->weights);
    cudaFree(b->rope_cs);
    cudaFree(b->rope_cs_local);
    cudaFree(b->meta_dev);
    if (b->meta_host) cudaFreeHost(b->meta_host);
    if (b->logits_host) cudaFreeHost(b->logits_host);
    if (b->topk_host) cudaFreeHost(b->topk_host);
    if (b->mask_host) cudaFreeHost(b->mask_host);
    if (b->comm_stage) cudaFreeHost(b->comm_stage);
    cb_link_buf_free(b);
    h->free(h->ctx, b->layers);
    loom_cuda_gemm_destroy(b->gemm);
    cb_mask_stream_destroy(b);
    if (b->stream) cudaStreamDestroy(b->stream);
    cb_green_destroy(b);
    h->free(h->ctx, b);
}

loom_status cb_bind_current_device(cuda_backend *b, loom_error *err) {
    const loom_host *h = b->host;
    int d = -1;
    loom_status st;
    if ((st = CB_CUDA(b, err, cudaGetDevice(&d)))) return st;
    if (d == b->device) return LOOM_OK;
    struct cudaDeviceProp prop;
    if ((st = CB_CUDA(b, err, cudaGetDeviceProperties(&prop, d)))) return st;
    if (prop.major != 9 || prop.minor != 0)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: tensor-parallel rank bound to device %d (%s), which is "
                        "sm_%d%d, but this build carries sm_90a code only (Hopper: H100/H200); "
                        "choose Hopper GPUs with CUDA_VISIBLE_DEVICES",
                        d, prop.name, prop.major, prop.minor);
    if (b->green)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: sm_count (a green context on device %d) on a tensor-parallel rank "
                        "(device %d) is not supported: leave sm_count 0 there", b->device, d);
    /* the stream and cuBLASLt context (with its workspace) belong to the
     * device the instance was created on: release them there, then make
     * new ones on d */
    const int old = b->device;
    cudaSetDevice(old);
    if (b->stream) cudaStreamSynchronize(b->stream);
    loom_cuda_gemm_destroy(b->gemm);
    cb_mask_stream_destroy(b);
    if (b->stream) cudaStreamDestroy(b->stream);
    b->gemm = NULL;
    b->stream = NULL;
    b->device = d;
    b->num_sms = prop.multiProcessorCount;
    snprintf(b->device_name, sizeof b->device_name, "%.127s", prop.name);
    if ((st = CB_CUDA(b, err, cudaSetDevice(d))) ||
        (st = CB_CUDA(b, err, cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking))))
        return st;
    int code = 0;
    char msg[256] = "";
    b->gemm = loom_cuda_gemm_create((size_t)32 << 20, &code, msg, sizeof msg);
    if (!b->gemm)
        return h->error(h->ctx, err, code == 10000 + (int)cudaErrorMemoryAllocation
                                         ? LOOM_ERR_NOMEM : LOOM_ERR_DEVICE,
                        "backend cuda: cuBLASLt setup on device %d: %s", d, msg);
    h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "moved from device %d to device %d (%s, %d SMs): the "
           "tensor-parallel rank's GPU", old, d, prop.name, prop.multiProcessorCount);
    return LOOM_OK;
}

/* ----------------------------------------------------------- memory / KV */

static size_t cb_kv_block_bytes(void *self, int32_t block_size, loom_dtype dtype) {
    cuda_backend *b = self;
    loom_dtype dt = cb_kv_resolve(b, dtype);
    if (!b->loaded || block_size <= 0 || dt == LOOM_DTYPE_COUNT) return 0;
    size_t per_pool = (size_t)b->mc.num_kv_heads * (size_t)block_size * (size_t)b->mc.head_dim *
                      loom_dtype_block_bytes(dt);
    return per_pool * 2 * (size_t)b->nlayers; /* a pipeline stage: its layers only */
}

static loom_status cb_memory(void *self, loom_backend_memory *out, loom_error *err) {
    cuda_backend *b = self;
    if (!out)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cuda: memory() needs an output struct");
    size_t free_b = 0, total = 0;
    loom_status st;
    if ((st = CB_CUDA(b, err, cudaSetDevice(b->device))) ||
        (st = CB_CUDA(b, err, cudaMemGetInfo(&free_b, &total))))
        return st;
    *out = (loom_backend_memory){.struct_size = sizeof *out, .total_bytes = total,
                                 .free_bytes = free_b, .weight_bytes = b->weight_bytes};
    return LOOM_OK;
}

/* kv_groups() (loom/backend.h): with the kv_groups parameter (default on), the plan
 * every backend makes alike (kv_groups.h) over this instance's layers — a
 * tensor-parallel rank holds them all, a pipeline stage its own; without
 * it one group of those layers and no window, so the cache keeps each
 * layer's whole history. */
static loom_status cb_kv_groups(void *self, loom_kv_groups *out, loom_error *err) {
    cuda_backend *b = self;
    if (!b->loaded || !out)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID, "backend cuda: kv_groups() %s",
                              !out ? "without an output" : "before load()");
    if (b->cfg.kv_groups) {
        loom_kv_groups_plan(&b->mc, b->layer0, b->nlayers, out, NULL, NULL);
        return LOOM_OK;
    }
    const uint32_t size = out->struct_size;
    *out = (loom_kv_groups){.struct_size = size, .num_groups = 1, .layers_per_block = b->nlayers,
                            .num_layers = b->nlayers};
    return LOOM_OK;
}

/* Each held layer's pool pair and block-table group for `layout`: its own
 * pair (counted from layer0) and group 0, or with groups (layout
 * num_groups > 1) the plan's. */
static loom_status cb_kv_slots(cuda_backend *b, const loom_kv_layout *layout, loom_error *err) {
    const loom_host *h = b->host;
    const int32_t L = b->nlayers, l0 = b->layer0;
    const int32_t groups = LOOM_HAS_FIELD(layout, loom_kv_layout, num_groups) ? layout->num_groups : 0;
    b->kv_groups = 1;
    b->kv_npools = L;
    for (int32_t i = 0; i < L; i++) b->layers[l0 + i].kv_slot = i, b->layers[l0 + i].kv_group = 0;
    if (groups <= 1) return LOOM_OK;
    if (!b->cfg.kv_groups)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: a KV layout of %d block-table groups, which this instance did not propose; "
                        "set backend.kv_groups: true, or cache.sliding_window: off",
                        groups);
    int32_t *grp = h->alloc(h->ctx, 2 * (size_t)L * sizeof *grp);
    if (!grp) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory");
    loom_kv_groups plan = {.struct_size = sizeof plan};
    loom_kv_groups_plan(&b->mc, l0, L, &plan, grp, grp + L);
    for (int32_t i = 0; i < L; i++) b->layers[l0 + i].kv_group = grp[i], b->layers[l0 + i].kv_slot = grp[L + i];
    h->free(h->ctx, grp);
    if (plan.num_groups != groups)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cuda: the KV layout has %d block-table groups; this model's layers make %d "
                        "(kv_groups())",
                        groups, plan.num_groups);
    b->kv_groups = groups;
    b->kv_npools = plan.layers_per_block;
    return LOOM_OK;
}

static void cb_kv_free(cuda_backend *b) {
    const loom_host *h = b->host;
    if (b->pools) {
        for (int32_t i = 0; i < 2 * b->kv_npools; i++)
            if (b->pools[i]) cudaFree(b->pools[i]);
        h->free(h->ctx, b->pools);
        b->pools = NULL;
    }
    cudaFree(b->pools_dev);
    cudaFree(b->swap_dev);
    if (b->swap) cudaFreeHost(b->swap);
    b->pools_dev = NULL;
    b->swap_dev = NULL;
    b->swap = NULL;
}

static loom_status cb_kv_alloc(void *self, const loom_kv_layout *layout, loom_error *err) {
    cuda_backend *b = self;
    const loom_host *h = b->host;
    loom_status st;
    if (!b->loaded)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cuda: kv_alloc() before load()");
    if (b->kv_ready)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cuda: kv_alloc() called twice; KV pools are allocated once");
    if (!layout || layout->block_size <= 0 || layout->num_blocks <= 0 ||
        layout->num_cpu_blocks < 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cuda: bad KV layout (block_size %d, num_blocks %d, "
                        "num_cpu_blocks %d): need block_size > 0, num_blocks > 0, cpu blocks >= 0",
                        layout ? layout->block_size : 0, layout ? layout->num_blocks : 0,
                        layout ? layout->num_cpu_blocks : 0);
    if ((st = cb_kv_slots(b, layout, err))) return st;
    loom_dtype dt = cb_kv_resolve(b, layout->dtype);
    if (dt == LOOM_DTYPE_COUNT)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: KV cache dtype %s is not supported; this instance holds "
                        "its compute type %s or fp8_e4m3 (set the backend's dtype, or leave the "
                        "cache's dtype to the backend)",
                        loom_dtype_name(layout->dtype), loom_dtype_name(b->ldt));
    const int32_t L = b->kv_npools; /* pool pairs */
    const loom_cuda_kv kv = dt == LOOM_DTYPE_FP8_E4M3 ? LOOM_CUDA_KV_E4M3 : LOOM_CUDA_KV_DT;
    const size_t kv_elt = LOOM_CUDA_KV_ELT(kv);
    const size_t block = (size_t)b->mc.num_kv_heads * (size_t)layout->block_size *
                         (size_t)b->mc.head_dim * kv_elt;
    const size_t pool = block * (size_t)layout->num_blocks;
    const size_t need = pool * 2 * (size_t)L;
    if (pool / kv_elt > (size_t)UINT32_MAX)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: one KV pool of %d blocks would hold %.2f G elements; the "
                        "attention kernels index a pool with 32 bits (4 G elements); lower "
                        "cache.num_blocks or cache.memory_fraction",
                        layout->num_blocks, (double)(pool / kv_elt) / 1e9);
    size_t free_b = 0, total = 0;
    if ((st = CB_CUDA(b, err, cudaSetDevice(b->device))) ||
        (st = CB_CUDA(b, err, cudaMemGetInfo(&free_b, &total))))
        return st;
    if (need > free_b)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cuda: KV pools of %d blocks x %zu bytes (%d pool pairs, K and V) "
                        "need %.1f MiB but device %d has %.1f MiB free; lower "
                        "cache.memory_fraction or cache.num_blocks, or engine.max_model_len",
                        layout->num_blocks, block * 2 * (size_t)L, L, cb_mib(need), b->device,
                        cb_mib(free_b));
    b->pools = h->calloc(h->ctx, 2 * (size_t)L, sizeof(void *));
    if (!b->pools)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory");
    for (int32_t i = 0; i < 2 * L; i++) {
        cudaError_t e = cudaMalloc(&b->pools[i], pool);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            cudaMemGetInfo(&free_b, &total);
            cb_kv_free(b);
            return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                            "backend cuda: cudaMalloc of KV pool %d of %d (%.1f MiB each, %.1f MiB "
                            "in all) failed with %s; %.1f MiB free; lower cache.memory_fraction "
                            "or cache.num_blocks, or engine.max_model_len",
                            i + 1, 2 * L, cb_mib(pool), cb_mib(need), cudaGetErrorName(e),
                            cb_mib(free_b));
        }
        /* zeros: padded graph rows read block 0; never let them see NaN bits */
        if ((st = CB_CUDA(b, err, cudaMemsetAsync(b->pools[i], 0, pool, b->stream)))) goto fail;
    }
    if ((st = CB_CUDA(b, err, cudaMalloc((void **)&b->pools_dev, 2 * (size_t)L * sizeof(void *)))) ||
        (st = CB_CUDA(b, err, cudaMemcpyAsync(b->pools_dev, b->pools, 2 * (size_t)L * sizeof(void *),
                                              cudaMemcpyHostToDevice, b->stream))))
        goto fail;
    if (layout->num_cpu_blocks > 0) {
        const size_t host_pool = block * (size_t)layout->num_cpu_blocks;
        cudaError_t e = cudaHostAlloc(&b->swap, host_pool * 2 * (size_t)L,
                                      cudaHostAllocMapped | cudaHostAllocPortable);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            b->swap = NULL;
            st = h->error(h->ctx, err, LOOM_ERR_NOMEM,
                          "backend cuda: could not pin %.1f MiB of host memory for %d swap "
                          "blocks (%s); lower the cache's cpu (swap) blocks",
                          cb_mib(host_pool * 2 * (size_t)L), layout->num_cpu_blocks,
                          cudaGetErrorName(e));
            goto fail;
        }
        void **hp = h->alloc(h->ctx, 2 * (size_t)L * sizeof(void *));
        if (!hp) {
            st = h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory");
            goto fail;
        }
        for (int32_t i = 0; i < 2 * L && st == LOOM_OK; i++) {
            void *dp = NULL;
            st = CB_CUDA(b, err, cudaHostGetDevicePointer(&dp, (char *)b->swap + host_pool * i, 0));
            hp[i] = dp;
        }
        if (st == LOOM_OK &&
            (st = CB_CUDA(b, err, cudaMalloc((void **)&b->swap_dev, 2 * (size_t)L * sizeof(void *)))) ==
                LOOM_OK)
            st = CB_CUDA(b, err, cudaMemcpy(b->swap_dev, hp, 2 * (size_t)L * sizeof(void *),
                                            cudaMemcpyHostToDevice));
        h->free(h->ctx, hp);
        if (st) goto fail;
    }
    if ((st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream)))) goto fail;
    /* the attention kernels for an E4M3 cache use other shared memory:
     * their resident CTAs (the split-K bound) follow the cache's type */
    for (int k = 0; k < 2; k++) {
        int per_sm = loom_cuda_attn_ctas_per_sm(b->dt, kv, (loom_cuda_attn_shape)k, b->mc.head_dim);
        b->attn_resident[k] = (per_sm > 0 ? per_sm : 1) * b->num_sms;
    }
    b->kv_layout = *layout;
    b->kv_layout.dtype = dt;
    b->kv = kv;
    b->kv_block_bytes = block;
    b->kv_ready = true;
    h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "KV pools (%s): %d blocks of %d tokens, %.1f MiB (+%d "
           "swap blocks, %.1f MiB pinned); %d block-table group%s, %d pool pairs",
           loom_dtype_name(dt), layout->num_blocks, layout->block_size, cb_mib(need), layout->num_cpu_blocks,
           cb_mib(block * 2 * (size_t)L * (size_t)layout->num_cpu_blocks), b->kv_groups,
           b->kv_groups == 1 ? "" : "s", L);
    if (h->metric_set) h->metric_set(h->ctx, "backend.cuda.kv_bytes", (double)need);
    return cb_warm_pieces(b, err);

fail:
    cudaStreamSynchronize(b->stream);
    cb_kv_free(b);
    return st;
}

/* ---------------------------------------------------------- block copies */

static loom_status cb_check_pairs(cuda_backend *b, const char *op, const int32_t *pairs, int32_t n,
                                  int32_t src_n, const char *src_what, int32_t dst_n,
                                  const char *dst_what, loom_error *err) {
    const loom_host *h = b->host;
    if (!b->kv_ready)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cuda: %s() before kv_alloc()", op);
    if (n < 0 || (n > 0 && !pairs))
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cuda: %s(): bad pair list (n %d)",
                        op, n);
    for (int32_t i = 0; i < n; i++) {
        int32_t s = pairs[2 * i], d = pairs[2 * i + 1];
        if (s < 0 || s >= src_n || d < 0 || d >= dst_n)
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "backend cuda: %s() pair %d is {%d, %d}: source must be a %s block in "
                            "[0, %d), destination a %s block in [0, %d)",
                            op, i, s, d, src_what, src_n, dst_what, dst_n);
    }
    return LOOM_OK;
}

/* Upload pairs and run one copy kernel over every pair and every pool. The
 * pairs come from pageable memory: cudaMemcpyAsync has staged them before
 * it returns, so the caller may reuse its array at once. */
static loom_status cb_copy(cuda_backend *b, void *const *src_pools, void *const *dst_pools,
                           const int32_t *pairs, int32_t n, loom_error *err) {
    loom_status st;
    if (n == 0) return LOOM_OK;
    if ((st = CB_CUDA(b, err, cudaSetDevice(b->device)))) return st;
    if (n > b->pairs_cap) {
        int32_t cap = n < 1024 ? 1024 : n;
        cudaFree(b->pairs_dev); /* synchronises: earlier copies are done with it */
        b->pairs_dev = NULL;
        b->pairs_cap = 0;
        if ((st = CB_CUDA(b, err, cudaMalloc((void **)&b->pairs_dev, (size_t)cap * 2 * sizeof(int32_t)))))
            return st;
        b->pairs_cap = cap;
    }
    if ((st = CB_CUDA(b, err, cudaMemcpyAsync(b->pairs_dev, pairs, (size_t)n * 2 * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, b->stream))))
        return st;
    return CB_CUDA(b, err, loom_cuda_copy_blocks(src_pools, dst_pools, 2 * b->kv_npools,
                                                 b->pairs_dev, n, b->kv_block_bytes, b->stream));
}

static loom_status cb_copy_blocks(void *self, const int32_t *pairs, int32_t n, loom_error *err) {
    cuda_backend *b = self;
    int32_t nb = b->kv_layout.num_blocks;
    loom_status st = cb_check_pairs(b, "copy_blocks", pairs, n, nb, "device", nb, "device", err);
    if (st) return st;
    return cb_copy(b, b->pools_dev, b->pools_dev, pairs, n, err);
}

static loom_status cb_swap_blocks(void *self, loom_swap_dir dir, const int32_t *pairs, int32_t n,
                                  loom_error *err) {
    cuda_backend *b = self;
    int32_t nd = b->kv_layout.num_blocks, nh = b->kv_layout.num_cpu_blocks;
    if (dir != LOOM_SWAP_OUT && dir != LOOM_SWAP_IN)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cuda: swap_blocks(): direction %d is neither OUT nor IN",
                              (int)dir);
    bool out = dir == LOOM_SWAP_OUT;
    loom_status st = cb_check_pairs(b, "swap_blocks", pairs, n, out ? nd : nh,
                                    out ? "device" : "host", out ? nh : nd,
                                    out ? "host" : "device", err);
    if (st) return st;
    return out ? cb_copy(b, b->pools_dev, b->swap_dev, pairs, n, err)
               : cb_copy(b, b->swap_dev, b->pools_dev, pairs, n, err);
}

/* The block-image transfer of loom/backend.h: per block, each layer's K
 * then V. One copy kernel gathers (read) or scatters (write) every (block,
 * layer, K|V) — pair {block, i * 2L} against pool pointers that put layer
 * l's K|V at (2l + kv) * bb in image i — straight into or out of `buf`
 * when it is device memory of this device (another engine's buffer mapped
 * through CUDA IPC: no host copy); for host memory, chunks of blocks go
 * through a device staging buffer (at most CB_IMG_STAGE bytes) and one
 * copy each to or from `buf`. Waited for before returning. */
#define CB_IMG_STAGE ((size_t)256 << 20)

/* Whether buf is device memory of this backend's device (*on_device) or
 * host memory; device memory of another device is refused. */
static loom_status cb_image_memory(cuda_backend *b, const char *op, const void *buf, bool *on_device,
                                   loom_error *err) {
    struct cudaPointerAttributes a;
    *on_device = false;
    if (cudaPointerGetAttributes(&a, buf) != cudaSuccess) { /* older drivers: unregistered host memory */
        (void)cudaGetLastError();
        return LOOM_OK;
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) return LOOM_OK;
    if (a.device != b->device)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cuda: %s(): the buffer is memory of CUDA device %d, this backend runs on %d", op,
                              a.device, b->device);
    if ((uintptr_t)buf % 16) /* the copy kernel moves 16 bytes at a time */
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cuda: %s(): a device buffer must be 16-byte aligned (%p)", op, buf);
    *on_device = true;
    return LOOM_OK;
}

/* The staging buffer (host buffers only) and the pointer and pair arrays
 * for chunks of `chunk_blocks` images. */
static loom_status cb_image_scratch(cuda_backend *b, size_t stage, int32_t chunk_blocks, loom_error *err) {
    loom_status st;
    if (b->img_stage_bytes < stage) {
        cudaStreamSynchronize(b->stream);
        cudaFree(b->img_stage);
        b->img_stage = NULL;
        b->img_stage_bytes = 0;
        if ((st = CB_CUDA(b, err, cudaMalloc(&b->img_stage, stage)))) return st;
        b->img_stage_bytes = stage;
    }
    if (!b->img_ptrs_dev &&
        (st = CB_CUDA(b, err, cudaMalloc((void **)&b->img_ptrs_dev, 4 * (size_t)b->nlayers * sizeof(void *)))))
        return st;
    if (b->img_pairs_cap < chunk_blocks) {
        cudaStreamSynchronize(b->stream);
        cudaFree(b->img_pairs_dev);
        b->img_pairs_dev = NULL;
        b->img_pairs_cap = 0;
        if ((st = CB_CUDA(b, err, cudaMalloc((void **)&b->img_pairs_dev, (size_t)chunk_blocks * 2 * sizeof(int32_t)))))
            return st;
        b->img_pairs_cap = chunk_blocks;
    }
    return LOOM_OK;
}

static loom_status cb_kv_image(cuda_backend *b, const char *op, const int32_t *blocks, int32_t n, void *buf,
                               size_t len, bool read, loom_error *err) {
    const loom_host *h = b->host;
    if (!b->kv_ready) return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cuda: %s() before kv_alloc()", op);
    const int32_t L = b->nlayers; /* a pipeline stage's image holds its layers */
    const size_t bb = b->kv_block_bytes, per = bb * 2 * (size_t)L;
    if (n < 0 || (n > 0 && (!blocks || !buf)) || len != per * (size_t)(n > 0 ? n : 0))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cuda: %s(): %d blocks need a buffer of exactly %zu bytes (%zu per block), got %zu", op,
                        n, per * (size_t)(n > 0 ? n : 0), per, len);
    for (int32_t i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= b->kv_layout.num_blocks)
            return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cuda: %s(): block %d is id %d, outside [0, %d)", op,
                            i, blocks[i], b->kv_layout.num_blocks);
    if (n == 0) return LOOM_OK;
    loom_status st = CB_CUDA(b, err, cudaSetDevice(b->device));
    bool on_dev = false;
    if (!st) st = cb_image_memory(b, op, buf, &on_dev, err);
    if (st) return st;
    /* device memory: every block in one kernel; host: chunks through the staging buffer */
    const size_t stage = on_dev ? 0
                         : (size_t)n * per < CB_IMG_STAGE ? (size_t)n * per
                                                          : (CB_IMG_STAGE / per ? CB_IMG_STAGE / per : 1) * per;
    if ((st = cb_image_scratch(b, stage, on_dev ? n : (int32_t)(stage / per), err))) return st;
    const int32_t chunk = on_dev ? n : (int32_t)(b->img_stage_bytes / per);
    char *img = on_dev ? buf : b->img_stage;
    void **ptrs = h->calloc(h->ctx, 4 * (size_t)L, sizeof(void *));
    int32_t *pairs = h->calloc(h->ctx, (size_t)chunk * 2, sizeof(int32_t));
    if (!ptrs || !pairs) {
        h->free(h->ctx, ptrs);
        h->free(h->ctx, pairs);
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: %s(): out of host memory", op);
    }
    /* pools: [0, 2L) the pool side, [2L, 4L) the image side */
    for (int32_t l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) {
            ptrs[2 * l + kv] = b->pools[kv * b->kv_npools + b->layers[b->layer0 + l].kv_slot];
            ptrs[2 * L + 2 * l + kv] = img + (size_t)(2 * l + kv) * bb;
        }
    void *const *pool_side = b->img_ptrs_dev, *const *img_side = b->img_ptrs_dev + 2 * L;
    st = CB_CUDA(b, err, cudaMemcpyAsync(b->img_ptrs_dev, ptrs, 4 * (size_t)L * sizeof(void *), cudaMemcpyHostToDevice,
                                         b->stream));
    char *p = buf;
    for (int32_t c0 = 0; c0 < n && !st; c0 += chunk) {
        const int32_t m = n - c0 < chunk ? n - c0 : chunk;
        for (int32_t i = 0; i < m; i++) {
            pairs[2 * i + (read ? 0 : 1)] = blocks[c0 + i];
            pairs[2 * i + (read ? 1 : 0)] = i * 2 * L;
        }
        /* pageable sources: staged before the call returns, so pairs and
         * the host chunk may be reused at once */
        if ((st = CB_CUDA(b, err, cudaMemcpyAsync(b->img_pairs_dev, pairs, (size_t)m * 2 * sizeof(int32_t),
                                                  cudaMemcpyHostToDevice, b->stream))))
            break;
        if (!on_dev && !read &&
            (st = CB_CUDA(b, err, cudaMemcpyAsync(b->img_stage, p, (size_t)m * per, cudaMemcpyHostToDevice, b->stream))))
            break;
        if ((st = CB_CUDA(b, err, loom_cuda_copy_blocks(read ? pool_side : img_side, read ? img_side : pool_side,
                                                         2 * L, b->img_pairs_dev, m, bb, b->stream))))
            break;
        if (!on_dev && read &&
            (st = CB_CUDA(b, err, cudaMemcpyAsync(p, b->img_stage, (size_t)m * per, cudaMemcpyDeviceToHost, b->stream))))
            break;
        p += (size_t)m * per;
    }
    loom_status sync = CB_CUDA(b, err, cudaStreamSynchronize(b->stream));
    h->free(h->ctx, ptrs);
    h->free(h->ctx, pairs);
    return st ? st : sync;
}

static int32_t cb_kv_image_device(void *self) {
    cuda_backend *b = self;
    return b->kv_ready ? b->device : -1;
}

/* the compute type: what a layout of LOOM_DTYPE_COUNT gets (cb_kv_resolve) */
static loom_dtype cb_kv_default_dtype(void *self) { return cb_kv_resolve(self, LOOM_DTYPE_COUNT); }

static loom_status cb_kv_read_blocks(void *self, const int32_t *blocks, int32_t n, void *buf, size_t len,
                                     loom_error *err) {
    return cb_kv_image(self, "kv_read_blocks", blocks, n, buf, len, true, err);
}

static loom_status cb_kv_write_blocks(void *self, const int32_t *blocks, int32_t n, const void *buf, size_t len,
                                      loom_error *err) {
    return cb_kv_image(self, "kv_write_blocks", blocks, n, (void *)buf, len, false, err);
}

/* ------------------------------------------------------------- descriptor */

static const loom_backend_ops cb_ops = {
    .struct_size = sizeof(loom_backend_ops),
    .create = cb_create,
    .destroy = cb_destroy,
    .load = cb_load,
    .kv_block_bytes = cb_kv_block_bytes,
    .memory = cb_memory,
    .kv_alloc = cb_kv_alloc,
    .forward = cb_forward,
    .forward_topk = cb_forward_topk,
    .copy_blocks = cb_copy_blocks,
    .swap_blocks = cb_swap_blocks,
    .kv_read_blocks = cb_kv_read_blocks,
    .kv_write_blocks = cb_kv_write_blocks,
    .kv_image_device = cb_kv_image_device,
    .kv_default_dtype = cb_kv_default_dtype,
    .kv_groups = cb_kv_groups,
    .load_shard = cb_load_shard,
    .load_stage = cb_load_stage,
};

static const loom_component cb_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_BACKEND,
    .name = "cuda",
    .summary = "Llama-family forward on one NVIDIA Hopper GPU: bf16/f16, cuBLASLt GEMMs, paged "
               "flash attention, CUDA graphs for decode and (piecewise) prefill",
    .ops = &cb_ops,
    .params = cb_params,
    .config_size = sizeof(cuda_backend_config),
}};

static const loom_plugin_desc cb_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-backend-cuda",
    .version = "0.1.0",
    .num_components = 1,
    .components = cb_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &cb_desc; }
