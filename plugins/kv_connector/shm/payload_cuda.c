/*
 * plugins/kv_connector/shm/payload_cuda.c — `cuda-ipc`'s payloads: the
 * sender copies the payload into device memory it allocates on its current
 * CUDA device and passes a CUDA IPC handle (cudaIpcGetMemHandle, 64 bytes)
 * in the frame; the peer opens it (cudaIpcOpenMemHandle), copies it out and
 * closes it before acknowledging, and the sender then frees it.
 *
 * The engines hand block images over in host memory today
 * (loom_kv_export.read, loom_engine_kv_deliver), so each side still copies
 * host <-> device once; a backend that reads and writes KV blocks on its
 * device could hand the device buffer over directly. Untested on a GPU: CI
 * compiles it, and without a visible device create() refuses cleanly.
 */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "payload.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == KVC_SHM_NAME, "a CUDA IPC handle fills the frame's payload name");

loom_status pay_available(loom_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return kvc_fail(err, LOOM_ERR_UNSUPPORTED, "kv_connector cuda-ipc: no CUDA device visible (%s); use shm",
                        e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return LOOM_OK;
}

loom_status pay_put(const void *payload, uint64_t len, uint8_t where[KVC_SHM_NAME], void **token, loom_error *err) {
    void *d = NULL;
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaMalloc(&d, (size_t)len);
    if (e == cudaSuccess) e = cudaMemcpy(d, payload, (size_t)len, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaIpcGetMemHandle(&h, d);
    if (e != cudaSuccess) {
        if (d) cudaFree(d);
        *token = NULL;
        return kvc_fail(err, e == cudaErrorMemoryAllocation ? LOOM_ERR_NOMEM : LOOM_ERR_DEVICE,
                        "kv_connector cuda-ipc: sharing %llu bytes of device memory: %s", (unsigned long long)len,
                        cudaGetErrorString(e));
    }
    memcpy(where, &h, sizeof h);
    *token = d;
    return LOOM_OK;
}

void pay_release(void *token, const uint8_t where[KVC_SHM_NAME]) {
    if (token) cudaFree(token);
}

loom_status pay_open(const uint8_t where[KVC_SHM_NAME], uint64_t len, const void **ptr, void **token,
                     loom_error *err) {
    cudaIpcMemHandle_t h;
    memcpy(&h, where, sizeof h);
    *token = NULL;
    void *host = malloc(len ? (size_t)len : 1), *d = NULL;
    if (!host) return kvc_fail(err, LOOM_ERR_NOMEM, "kv_connector cuda-ipc: out of memory");
    /* a handle that names no allocation of the peer, or a length past its
     * end, fails here as a CUDA error, not as a stray read */
    cudaError_t e = cudaIpcOpenMemHandle(&d, h, cudaIpcMemLazyEnablePeerAccess);
    if (e == cudaSuccess) {
        e = cudaMemcpy(host, d, (size_t)len, cudaMemcpyDeviceToHost);
        cudaIpcCloseMemHandle(d);
    }
    if (e != cudaSuccess) {
        free(host);
        return kvc_fail(err, LOOM_ERR_DEVICE, "kv_connector cuda-ipc: opening the peer's payload: %s",
                        cudaGetErrorString(e));
    }
    *ptr = host;
    *token = host;
    return LOOM_OK;
}

void pay_close(void *token) { free(token); }
