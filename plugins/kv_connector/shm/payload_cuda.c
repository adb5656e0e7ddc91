/*
 * plugins/kv_connector/shm/payload_cuda.c — `cuda-ipc`'s payloads: the
 * sender copies the payload into a device buffer of the connector's device
 * and passes its CUDA IPC handle (cudaIpcGetMemHandle, 64 bytes) in the
 * frame; the peer opens it (cudaIpcOpenMemHandle), copies it out and closes
 * it before acknowledging, and the sender then puts the buffer back in its
 * pool for the next hand-over.
 *
 * What only shows on a GPU, and how it is handled:
 *   - The connector's threads (the prefill listener's handlers, the decode
 *     workers) are not the backend's: each call sets the `device` parameter
 *     as the thread's current device first (a fresh thread is on device 0).
 *   - A host-to-device cudaMemcpy from pageable memory may return before
 *     the DMA has landed, and the peer's reads are not ordered after it by
 *     any stream: both copies run on the call's own non-blocking stream and
 *     are waited for (cudaStreamSynchronize) before the handle is sent or
 *     the acknowledgement goes back. A non-blocking stream also keeps the
 *     copies out of the legacy default stream's implicit synchronisation.
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
 * The engines hand block images over in host memory (loom_kv_export.read,
 * loom_engine_kv_deliver), so each side still copies host <-> device once;
 * a backend that reads and writes KV blocks on its device could hand the
 * device buffer over directly (docs/disaggregation.md, "cuda-ipc"). Without
 * a visible device create() refuses cleanly ("no CUDA device visible ...
 * use shm").
 */
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

loom_status pay_put(int32_t device, const void *payload, uint64_t len, uint8_t where[KVC_SHM_NAME], void **token,
                    loom_error *err) {
    *token = NULL;
    const char *what = "selecting the device";
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda_fail(err, e, what, len, device);
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
        what = "allocating the hand-over buffer", e = cudaMalloc(&b->d, (size_t)b->cap);
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
    e = copy_sync(b->d, payload, len, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        pool_put(b, false);
        return cuda_fail(err, e, "copying the KV to the device", len, device);
    }
    memcpy(where, &b->h, sizeof b->h);
    *token = b;
    return LOOM_OK;
}

void pay_release(void *token, const uint8_t where[KVC_SHM_NAME], bool acked) {
    /* unacknowledged: the peer may still be reading it, so it is freed, not
     * handed to the next hand-over */
    if (token) pool_put(token, acked);
}

loom_status pay_open(int32_t device, const uint8_t where[KVC_SHM_NAME], uint64_t len, const void **ptr, void **token,
                     loom_error *err) {
    cudaIpcMemHandle_t h;
    memcpy(&h, where, sizeof h);
    *token = NULL;
    void *host = malloc(len ? (size_t)len : 1);
    if (!host) return kvc_fail(err, LOOM_ERR_NOMEM, "kv_connector cuda-ipc: out of memory");
    cudaError_t e = cudaSetDevice(device);
    const char *what = "selecting the device";
    /* our own export (one process holds both ends): read it in place — the
     * exporter keeps it until this side acknowledges. */
    bool own = false, size_ok = true;
    void *own_d = NULL;
    pthread_mutex_lock(&pool_mu);
    for (pay_buf *b = bufs; b; b = b->next)
        if (b->busy && memcmp(&b->h, &h, sizeof h) == 0) {
            own = true;
            size_ok = b->len == len;
            own_d = b->d;
            break;
        }
    pthread_mutex_unlock(&pool_mu);
    /* outside the lock (other hand-overs go on): the buffer stays busy
     * until this side acknowledges */
    if (own && size_ok && e == cudaSuccess)
        what = "reading the peer's payload", e = copy_sync(host, own_d, len, cudaMemcpyDeviceToHost);
    if (own && !size_ok) {
        free(host);
        return kvc_fail(err, LOOM_ERR_FORMAT,
                        "kv_connector cuda-ipc: the peer's payload is not the %llu bytes announced",
                        (unsigned long long)len);
    }
    if (!own && e == cudaSuccess) {
        /* a handle that names no allocation of the peer, or a length past
         * its end, fails here as a CUDA error, not as a stray read */
        what = "opening the peer's IPC handle (both servers must see the same GPU, in one node and one container; "
               "otherwise use shm)";
        void *d = NULL;
        e = cudaIpcOpenMemHandle(&d, h, cudaIpcMemLazyEnablePeerAccess);
        if (e == cudaSuccess) {
            what = "reading the peer's payload";
            e = copy_sync(host, d, len, cudaMemcpyDeviceToHost);
            /* closed before the acknowledgement: the peer reuses the buffer
             * for its next hand-over once acknowledged */
            cudaError_t ec = cudaIpcCloseMemHandle(d);
            if (e == cudaSuccess && ec != cudaSuccess) what = "cudaIpcCloseMemHandle", e = ec;
        }
    }
    if (e != cudaSuccess) {
        free(host);
        return cuda_fail(err, e, what, len, device);
    }
    *ptr = host;
    *token = host;
    return LOOM_OK;
}

void pay_close(void *token) { free(token); }
