/*
 * core/disagg/disagg.h — prefill/decode disaggregation between two engines
 * (docs/disaggregation.md): the host glue that drives a kv_connector
 * (loom/kv_connector.h) for `loom serve --role prefill|decode`.
 *
 * Prefill role: a listener thread accepts decode engines; each connection
 * gets a handler thread that reads one PREFILL message, runs the prompt as
 * a one-token request whose on_kv_export copies out the KV of all but its
 * last token, and answers with a KV message (or ERROR), then closes.
 * Decode role: loom_disagg_remote_prefill() starts a worker thread per
 * request that connects, sends the prompt, receives the KV and hands it to
 * the engine (loom_engine_kv_deliver) — or ends the request with the reason
 * (loom_engine_kv_fail). Every wait is bounded by the connector's
 * timeout_ms, which also bounds the prefill's own compute; a failure ends
 * that one request with an error and nothing else.
 *
 * The engine must be stepped by another thread (the server's); `wake` is
 * called whenever a request was added or delivered so that thread steps.
 * Threads: create and destroy on the thread that owns the engine; the rest
 * [any]. Core-internal (not installed).
 */
#ifndef LOOM_CORE_DISAGG_H
#define LOOM_CORE_DISAGG_H

#include <stdint.h>

#include "loom/engine.h"

typedef struct loom_disagg loom_disagg;

typedef enum loom_disagg_role {
    LOOM_DISAGG_PREFILL = 1,
    LOOM_DISAGG_DECODE = 2,
} loom_disagg_role;

typedef struct loom_disagg_stats {
    uint64_t transfers_ok;     /* hand-overs completed (either role)        */
    uint64_t transfers_failed; /* hand-overs that ended in an error         */
    uint64_t bytes;            /* block-image bytes moved                   */
    uint64_t host_bytes;       /* of them, bytes this side sent from or
                                  delivered out of host memory (0 when
                                  cuda-ipc joins two cuda backends: the
                                  blocks go device to device)               */
    uint64_t auth_failures;    /* prefill: peers refused by the handshake   */
    uint64_t send_us;          /* prefill: time in the connector's send of
                                  the KV (placing it, the peer's open and
                                  acknowledgement), microseconds            */
    uint64_t deliver_us;       /* decode: time handing received KV to the
                                  engine (loom_engine_kv_deliver's copy)    */
    int32_t in_flight;         /* handler / worker threads running now      */
} loom_disagg_stats;

/* Create the pipeline's `kv_connector:` instance for engine e and, in the
 * prefill role, start listening. LOOM_ERR_INVALID when the pipeline has no
 * kv_connector section; LOOM_ERR_UNSUPPORTED when the engine's KV cannot
 * leave it (loom_engine_kv_info). */
loom_status loom_disagg_create(loom_engine *e, loom_disagg_role role, void (*wake)(void *ctx), void *wake_ctx,
                               loom_disagg **out, loom_error *err);
/* Stop the listener and wait for every handler and worker (each ends
 * within the connector's timeout once the engine has taken what it waits
 * for); stats stay readable. The engine must still be stepped meanwhile
 * (handlers wait for their prefill, decode workers for the step that writes
 * their KV in place), and destroyed only after this returns. NULL-safe; a
 * second call does nothing. */
void loom_disagg_stop(loom_disagg *d);
/* loom_disagg_stop, then destroy the connector and free d. NULL-safe. */
void loom_disagg_destroy(loom_disagg *d);

/* Decode role: fetch the KV of request `request_id` (added with kv_remote)
 * for its prompt tokens[0..n) (n >= 2; copied) from the prefill engine.
 * Returns at once; the outcome reaches the engine. On failure to start
 * (too many in flight, out of memory) nothing was started: the caller
 * fails the request itself. */
loom_status loom_disagg_remote_prefill(loom_disagg *d, int64_t request_id, const int32_t *tokens, int32_t n,
                                       loom_error *err);

void loom_disagg_get_stats(loom_disagg *d, loom_disagg_stats *out);

#endif
