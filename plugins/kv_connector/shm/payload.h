/*
 * plugins/kv_connector/shm/payload.h — where a same-host connector puts a
 * payload out of band: one implementation per connector (payload_posix.c
 * for `shm`, payload_cuda.c for `cuda-ipc`), chosen at build time.
 * Every function is [any]; a token belongs to one connection.
 */
#ifndef LOOM_KV_PAYLOAD_H
#define LOOM_KV_PAYLOAD_H

#include <stdint.h>

#include "kvc.h"

/* The component's name and one-line summary (PAY_NAME, PAY_SUMMARY), set by
 * the build: -DPAY_CUDA selects cuda-ipc. */
#ifdef PAY_CUDA
#define PAY_NAME "cuda-ipc"
#define PAY_SUMMARY "KV hand-over on one node through CUDA IPC device memory (needs a GPU)"
#else
#define PAY_NAME "shm"
#define PAY_SUMMARY "KV hand-over on one host: control over a Unix socket, blocks in POSIX shared memory"
#endif

/* `device` is the connector's `device` parameter (cuda-ipc: the CUDA
 * ordinal its buffers live on; shm ignores it). Every call makes it the
 * calling thread's current device itself: the connector's threads are not
 * the backend's. */

/* LOOM_OK when this transport can work in this process (cuda-ipc: CUDA
 * device `device` is visible), else LOOM_ERR_UNSUPPORTED saying why. */
loom_status pay_available(int32_t device, loom_error *err);
/* Sender: place len bytes of payload where the peer can open them and
 * describe that place in where[KVC_SHM_NAME]; *token until pay_release.
 * `payload_device` is -1 for host memory, else the CUDA ordinal of the
 * device memory the payload is (shm refuses it). `lent` (may be NULL)
 * holds a buffer pay_lend gave this connection: when the payload is that
 * buffer it is sent as it is, without a copy, and *lent becomes NULL.
 * When it returns the bytes are there (cuda-ipc: the copy has completed on
 * the device, not merely been queued). */
loom_status pay_put(int32_t device, const void *payload, int32_t payload_device, uint64_t len, void **lent,
                    uint8_t where[KVC_SHM_NAME], void **token, loom_error *err);
/* How a send of a payload ended, for pay_release. */
typedef enum pay_outcome {
    PAY_ACKED,                 /* the peer acknowledged: it is done with it */
    PAY_PEER_GONE,             /* never sent, or the peer closed / died     */
    PAY_PEER_MAY_READ,         /* no acknowledgement (a timeout, a bad
                                  frame): the peer may still read it        */
} pay_outcome;
/* Sender: drop the payload (cuda-ipc: an acknowledged buffer is reused,
 * one of a peer that is gone freed, one the peer may still read never
 * freed — freeing IPC-exported memory under a live mapping is undefined). */
void pay_release(void *token, const uint8_t where[KVC_SHM_NAME], pay_outcome how);
/* Receiver: open the peer's payload `where` that must be exactly len
 * bytes; *ptr until pay_close(*token) — host memory (shm, *ptr_device -1),
 * or device memory of CUDA ordinal *ptr_device (cuda-ipc: the peer's
 * buffer, mapped, on whichever device it lives; the caller acknowledges
 * only after pay_close). Anything else — a description that is not one of
 * ours, a length past the buffer — is an error. */
loom_status pay_open(int32_t device, const uint8_t where[KVC_SHM_NAME], uint64_t len, const void **ptr,
                     int32_t *ptr_device, void **token, loom_error *err);
/* Receiver: copy an opened payload (len bytes) into host memory dst. */
loom_status pay_to_host(void *token, void *dst, uint64_t len, loom_error *err);
void pay_close(void *token);

#ifdef PAY_CUDA
/* Sender (cuda-ipc): a device buffer of len bytes for the connection's
 * next payload (*ptr), so the backend gathers the KV straight into what
 * is sent; *token until pay_put takes it or pay_unlend gives it back. */
loom_status pay_lend(int32_t device, uint64_t len, void **ptr, void **token, loom_error *err);
void pay_unlend(void *token);
#endif

#endif
