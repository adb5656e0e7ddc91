/*
 * plugins/kv_connector/shm/payload_cuda.c — `cuda-ipc`'s payloads: device
 * buffers of the connector's device, passed as CUDA IPC handles
 * (cudaIpcGetMemHandle, 64 bytes) in the frame. Between two cuda backends
 * on one device no byte crosses host memory: the prefill engine's backend
 * gathers the KV blocks straight into a buffer lent here (pay_lend), the
 * decode side maps it (cudaIpcOpenMemHandle) and its backend scatters the
 * blocks straight from the mapping; the decode side closes the mapping and
 * only then acknowledges, and the sender puts the buffer back in its pool
 * for the next hand-over. A host payload (a cpu backend on the prefill
 * side) is copied in; a receiver that cannot read the device copies out
 * (pay_to_host).
 *
 * What only shows on a GPU, and how it is handled:
 *   - The connector's threads (the prefill listener's handlers, the decode
 *     workers) are not the backend's: each call sets the `device` parameter
 *     as the thread's current device first (a fresh thread is on device 0).
 *   - A host-to-device cudaMemcpy from pageable memory may return before
 *     the DMA has landed, and the peer's reads are not ordered after it by
 *     any stream: copies run on the call's own non-blocking stream and are
 *     waited for (cudaStreamSynchronize) before the handle is sent; the
 *     backends' kv_read_blocks / kv_write_blocks wait for their kernels
 *     before returning, which orders the two processes' kernels the same
 *     way. A non-blocking stream keeps the copies out of the legacy default
 *     stream's implicit synchronisation.
 *   - cudaFree (and often cudaMalloc) waits for all of the device's work,
 *     the engine's kernels included: buffers are pooled (sizes rounded to
 *     2 MiB, the smallest idle one that fits is taken, at most 1 GiB kept
 *     idle), so a steady stream of hand-overs allocates and frees nothing.
 *     A buffer goes back to the pool only once the peer acknowledged (it
 *     has closed its mapping); after a failed or timed-out send it is freed
 *     instead, as the peer may still be reading it.
 *   - cudaIpcOpenMemHandle refuses a handle its own process exported: a
 *     handle of one of this process's busy buffers is read through the
 *     exporter's pointer (two engines in one process, `loom plugin-test
 *     cuda-ipc`).
 *
 * Without a visible device create() refuses cleanly ("no CUDA device
 * visible ... use shm").
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "payload.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == KVC_SHM_NAME, "a CUDA IPC handle fills the frame's payload name");

/* A hand-over buffer of this process: exported (busy) from pay_put to
 * pay_release, then idle in the pool for the next pay_put. Its IPC handle
 * is taken once, at allocation. */
typedef struct pay_buf {
    struct pay_buf *next;
    cudaIpcMemHandle_t h;
    void *d;
    uint64_t cap;              /* bytes allocated                            */
    uint64_t len;              /* bytes of the hand-over it holds (busy)     */
    int32_t device;
    bool busy;
} pay_buf;

#define POOL_IDLE_MAX (1ull << 30) /* idle buffer bytes kept for reuse      */
#define POOL_ROUND (2ull << 20)    /* allocations in multiples of 2 MiB     */

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER; /* bufs, idle_bytes */
static pay_buf *bufs;
static uint64_t idle_bytes;

static loom_status cuda_fail(loom_error *err, cudaError_t e, const char *what, uint64_t len, int32_t device) {
    if (e == cudaErrorMemoryAllocation)
        return kvc_fail(err, LOOM_ERR_NOMEM,
                        "kv_connector cuda-ipc: %s: %llu bytes of device memory on device %d are not free (the KV "
                        "pool takes most of it: lower cache.memory_fraction or cache.memory_gib to leave room for "
                        "one hand-over per request in flight, or use shm)",
                        what, (unsigned long long)len, (int)device);
    return kvc_fail(err, LOOM_ERR_DEVICE, "kv_connector cuda-ipc: %s (%llu bytes, device %d): %s", what,
                    (unsigned long long)len, (int)device, cudaGetErrorString(e));
}

loom_status pay_available(int32_t device, loom_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return kvc_fail(err, LOOM_ERR_UNSUPPORTED, "kv_connector cuda-ipc: no CUDA device visible (%s); use shm",
                        e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (device < 0 || device >= n)
        return kvc_fail(err, LOOM_ERR_UNSUPPORTED,
                        "kv_connector cuda-ipc: device %d is not visible (%d device%s: 0..%d); set kv_connector.device "
                        "to the backend's device",
                        (int)device, n, n == 1 ? "" : "s", n - 1);
    return LOOM_OK;
}

/* dst <- src (len bytes) on a stream of its own, waited for. */
static cudaError_t copy_sync(void *dst, const void *src, uint64_t len, enum cudaMemcpyKind kind) {
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return e;
    e = cudaMemcpyAsync(dst, src, (size_t)len, kind, s);
    cudaError_t e2 = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return e != cudaSuccess ? e : e2;
}

/* Put b back in the pool (ok) or free it (a failed copy or send); beyond
 * POOL_IDLE_MAX idle bytes the largest idle buffers are freed. */
static void pool_put(pay_buf *b, bool ok) {
    pay_buf *drop = NULL;
    pthread_mutex_lock(&pool_mu);
    if (!ok) {
        for (pay_buf **q = &bufs; *q; q = &(*q)->next)
            if (*q == b) {
                *q = b->next;
                break;
            }
        b->next = NULL;
        drop = b;
    } else {
        b->busy = false;
        idle_bytes += b->cap;
    }
    while (idle_bytes > POOL_IDLE_MAX) {
        pay_buf **big = NULL;
        for (pay_buf **q = &bufs; *q; q = &(*q)->next)
            if (!(*q)->busy && (!big || (*q)->cap > (*big)->cap)) big = q;
        if (!big) break;
        pay_buf *x = *big;
        *big = x->next;
        idle_bytes -= x->cap;
        x->next = drop;
        drop = x;
    }
    pthread_mutex_unlock(&pool_mu);
    while (drop) {
        pay_buf *x = drop;
        drop = x->next;
        cudaSetDevice(x->device);
        cudaFree(x->d);
        free(x);
    }
}

/* Free the idle buffers of `device` (an allocation failed while they held
 * memory it needs); whether any were. */
static bool pool_drain_idle(int32_t device) {
    pay_buf *drop = NULL;
    pthread_mutex_lock(&pool_mu);
    for (pay_buf **q = &bufs; *q;) {
        pay_buf *x = *q;
        if (x->busy || x->device != device) {
            q = &x->next;
            continue;
        }
        *q = x->next;
        idle_bytes -= x->cap;
        x->next = drop;
        drop = x;
    }
    pthread_mutex_unlock(&pool_mu);
    const bool any = drop != NULL;
    while (drop) {
        pay_buf *x = drop;
        drop = x->next;
        cudaFree(x->d);
        free(x);
    }
    return any;
}

/* An idle pool buffer of `device` holding len bytes, or a new one: busy,
 * its handle taken. */
static loom_status pool_get(int32_t device, uint64_t len, pay_buf **out, loom_error *err) {
    *out = NULL;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda_fail(err, e, "selecting the device", len, device);
    /* the smallest idle buffer that holds it: no cudaMalloc, and no
     * cudaFree (which waits for the whole device, the engine's work too) */
    pay_buf *b = NULL;
    pthread_mutex_lock(&pool_mu);
    for (pay_buf *x = bufs; x; x = x->next)
        if (!x->busy && x->device == device && x->cap >= len && (!b || x->cap < b->cap)) b = x;
    if (b) {
        b->busy = true;
        idle_bytes -= b->cap;
    }
    pthread_mutex_unlock(&pool_mu);
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return kvc_fail(err, LOOM_ERR_NOMEM, "kv_connector cuda-ipc: out of memory");
        b->cap = (len + POOL_ROUND - 1) / POOL_ROUND * POOL_ROUND;
        if (!b->cap) b->cap = POOL_ROUND;
        b->device = device;
        b->busy = true;
        const char *what = "allocating the hand-over buffer";
        e = cudaMalloc(&b->d, (size_t)b->cap);
        if (e == cudaErrorMemoryAllocation && pool_drain_idle(device)) { /* idle ones too small: free, retry */
            (void)cudaGetLastError();
            e = cudaMalloc(&b->d, (size_t)b->cap);
        }
        if (e == cudaSuccess) what = "cudaIpcGetMemHandle", e = cudaIpcGetMemHandle(&b->h, b->d);
        if (e != cudaSuccess) {
            if (b->d) cudaFree(b->d);
            free(b);
            return cuda_fail(err, e, what, len, device);
        }
        pthread_mutex_lock(&pool_mu);
        b->next = bufs;
        bufs = b;
        pthread_mutex_unlock(&pool_mu);
    }
    b->len = len;
    *out = b;
    return LOOM_OK;
}

loom_status pay_lend(int32_t device, uint64_t len, void **ptr, void **token, loom_error *err) {
    pay_buf *b;
    loom_status st = pool_get(device, len, &b, err);
    *ptr = st == LOOM_OK ? b->d : NULL;
    *token = b;
    return st;
}

/* never exported: back to the pool as it is */
void pay_unlend(void *token) {
    if (token) pool_put(token, true);
}

loom_status pay_put(int32_t device, const void *payload, int32_t payload_device, uint64_t len, void **lent,
                    uint8_t where[KVC_SHM_NAME], void **token, loom_error *err) {
    *token = NULL;
    pay_buf *b = lent ? *lent : NULL;
    if (b && b->d == payload && b->device == device && len <= b->cap) {
        /* the backend gathered the KV into this buffer and waited for it */
        *lent = NULL;
        b->len = len;
    } else {
        loom_status st = pool_get(device, len, &b, err);
        if (st != LOOM_OK) return st;
        /* host memory, or device memory (this device or a peer: UVA) */
        cudaError_t e = copy_sync(b->d, payload, len, payload_device >= 0 ? cudaMemcpyDefault : cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            pool_put(b, false);
            return cuda_fail(err, e, payload_device >= 0 ? "copying the KV on the device" : "copying the KV to the device",
                             len, device);
        }
    }
    memcpy(where, &b->h, sizeof b->h);
    *token = b;
    return LOOM_OK;
}

void pay_release(void *token, const uint8_t where[KVC_SHM_NAME], pay_outcome how) {
    pay_buf *b = token;
    if (!b) return;
    if (how != PAY_PEER_MAY_READ) {
        pool_put(b, how == PAY_ACKED); /* reused, or freed: no mapping of it is left */
        return;
    }
    /* the peer may hold a mapping still (freeing it under one is undefined):
     * out of the pool for good, never freed — a leak a stuck peer costs */
    pthread_mutex_lock(&pool_mu);
    for (pay_buf **q = &bufs; *q; q = &(*q)->next)
        if (*q == b) {
            *q = b->next;
            break;
        }
    pthread_mutex_unlock(&pool_mu);
    free(b);
}

/* A received payload: the peer's buffer mapped into this process (or, for
 * this process's own export, read through the exporter's pointer). */
typedef struct pay_view {
    void *d;
    bool mapped;               /* opened by cudaIpcOpenMemHandle: closed at pay_close */
    int32_t device;            /* the device the memory lives on            */
    int32_t opener;            /* the device current when it was opened     */
    uint64_t len;
} pay_view;

/* Bytes from d to the end of its allocation, through the driver's
 * cuMemGetAddressRange (the runtime has none; fetched through the runtime,
 * so no libcuda at link time); false when it cannot be asked. */
typedef CUresult (*pfn_range)(CUdeviceptr *, size_t *, CUdeviceptr);
static bool mapped_bytes(const void *d, size_t *out) {
    static pfn_range fn;
    if (!fn) {
        void *p = NULL;
        enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !p)
            return false;
        fn = (pfn_range)p;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    if (fn(&base, &size, (CUdeviceptr)(uintptr_t)d) != CUDA_SUCCESS) return false;
    *out = size - (size_t)((uintptr_t)d - (uintptr_t)base);
    return true;
}

loom_status pay_open(int32_t device, const uint8_t where[KVC_SHM_NAME], uint64_t len, const void **ptr,
                     int32_t *ptr_device, void **token, loom_error *err) {
    cudaIpcMemHandle_t h;
    memcpy(&h, where, sizeof h);
    *token = NULL;
    *ptr_device = -1;
    pay_view *v = calloc(1, sizeof *v);
    if (!v) return kvc_fail(err, LOOM_ERR_NOMEM, "kv_connector cuda-ipc: out of memory");
    v->device = v->opener = device;
    v->len = len;
    cudaError_t e = cudaSetDevice(device);
    const char *what = "selecting the device";
    /* our own export (one process holds both ends): read it in place — the
     * exporter keeps it until this side acknowledges. */
    bool own = false, size_ok = true;
    pthread_mutex_lock(&pool_mu);
    for (pay_buf *b = bufs; b; b = b->next)
        if (b->busy && memcmp(&b->h, &h, sizeof h) == 0) {
            own = true;
            size_ok = b->len == len;
            v->d = b->d;
            break;
        }
    pthread_mutex_unlock(&pool_mu);
    if (own && !size_ok) {
        free(v);
        return kvc_fail(err, LOOM_ERR_FORMAT,
                        "kv_connector cuda-ipc: the peer's payload is not the %llu bytes announced",
                        (unsigned long long)len);
    }
    if (!own && e == cudaSuccess) {
        /* a handle that names no allocation of the peer fails here as a
         * CUDA error, not as a stray read */
        what = "opening the peer's IPC handle (both servers must see the same GPU, in one node and one container; "
               "otherwise use shm)";
        e = cudaIpcOpenMemHandle(&v->d, h, cudaIpcMemLazyEnablePeerAccess);
        v->mapped = e == cudaSuccess;
    }
    /* the device the memory lives on (a peer's GPU: the reader may not take it in place) */
    struct cudaPointerAttributes a;
    if (e == cudaSuccess && cudaPointerGetAttributes(&a, v->d) == cudaSuccess) v->device = a.device;
    /* a length past the peer's allocation is refused here, before a kernel reads past it */
    size_t have = 0;
    if (e == cudaSuccess && v->mapped && mapped_bytes(v->d, &have) && have < len) {
        pay_close(v);
        return kvc_fail(err, LOOM_ERR_FORMAT,
                        "kv_connector cuda-ipc: the peer announced %llu bytes in a buffer of %zu",
                        (unsigned long long)len, have);
    }
    if (e != cudaSuccess) {
        free(v);
        return cuda_fail(err, e, what, len, device);
    }
    *ptr = v->d;
    *ptr_device = v->device;
    *token = v;
    return LOOM_OK;
}

loom_status pay_to_host(void *token, void *dst, uint64_t len, loom_error *err) {
    pay_view *v = token;
    if (!v || len != v->len)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector cuda-ipc: no received payload of %llu bytes to copy",
                        (unsigned long long)len);
    cudaError_t e = cudaSetDevice(v->opener);
    if (e == cudaSuccess) e = copy_sync(dst, v->d, len, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? LOOM_OK : cuda_fail(err, e, "reading the peer's payload", len, v->device);
}

/* closed before the acknowledgement: the peer reuses the buffer for its
 * next hand-over once acknowledged */
void pay_close(void *token) {
    pay_view *v = token;
    if (!v) return;
    if (v->mapped && cudaSetDevice(v->opener) == cudaSuccess) cudaIpcCloseMemHandle(v->d);
    free(v);
}
