/*
 * cli/serve/server.h — the HTTP side of `loom serve`: an OpenAI-compatible
 * server (libmicrohttpd: a pool of polling threads, connections suspended
 * while they wait) in front of one engine stepped by its own thread, so
 * concurrent requests share the continuous batch.
 *
 * Threads: MHD's polling threads parse requests and add them to the engine
 * ([any] calls), then suspend the connection; the engine thread alone steps
 * and runs the token callbacks, which fill each job's buffers under the
 * job's mutex and resume the connection waiting on it (a non-streaming
 * answer, or the SSE reader). A watcher thread notices clients that leave
 * (MHD does not watch suspended connections) and keeps quiet streams alive.
 */
#ifndef LOOM_SERVE_SERVER_H
#define LOOM_SERVE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "loom/engine.h"

/* The default prompt cap's bound on one token's bytes: generous (the longest
 * pieces of common vocabularies are shorter), so that a prompt the context
 * could hold is never refused by bytes, while a prompt of megabytes is
 * refused before the tokenizer spends seconds and memory on it. */
#define SERVE_BYTES_PER_TOKEN 128

typedef struct serve_options {
    const char *host;           /* address or name to bind; "0.0.0.0" = all */
    int port;                   /* 0 = any free port (printed at start)     */
    const char *model_name;     /* what /v1/models lists and requests name  */
    const char *api_key;        /* NULL = no authentication                 */
    int32_t max_tokens;         /* completions' default max_tokens          */
    size_t max_body;            /* request bodies larger get 413            */
    size_t max_prompt_bytes;    /* longer prompt text gets 400 before it is
                                 * tokenized; 0 = max_model_len x
                                 * SERVE_BYTES_PER_TOKEN                   */
    unsigned max_connections;
    unsigned idle_timeout;      /* seconds an idle or half-sent connection is kept */
    bool parse_special;         /* special-token markers in prompts and message
                                 * content are tokens (loom_request.parse_special) */
    int role;                   /* SERVE_ROLE_*: colocated, or one side of a
                                 * disaggregated pair (docs/disaggregation.md) */
} serve_options;

enum {
    SERVE_ROLE_COLOCATED = 0,   /* prefill and decode in this engine         */
    SERVE_ROLE_PREFILL = 1,     /* also serve prefills to decode engines over
                                 * the pipeline's kv_connector              */
    SERVE_ROLE_DECODE = 2,      /* prompts' KV from a prefill engine         */
};

/* Serve until SIGINT or SIGTERM; then stop taking requests, abort the ones
 * running (their clients get an error), and return 0. Returns 1 when the
 * server cannot start (the reason on stderr). Prints the URL it listens on
 * to stdout, one line: "loom serve: listening on http://HOST:PORT". */
int serve_run(loom_engine *eng, const serve_options *opt);

#endif
