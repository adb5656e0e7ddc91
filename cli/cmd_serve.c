/*
 * cli/cmd_serve.c — `loom serve CONFIG`: an OpenAI-compatible HTTP server
 * (cli/serve/) over the engine a pipeline describes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "engine_setup.h"
#include "loom/engine.h"
#include "serve/server.h"

static const char serve_usage_text[] =
    "Usage: loom serve CONFIG [options]\n"
    "\n"
    "Serve the engine described by the pipeline file CONFIG over HTTP with the\n"
    "OpenAI API, as vLLM does: concurrent requests share the continuous batch.\n"
    "\n"
    "Endpoints:\n"
    "  POST /v1/completions       prompt (text, texts, or token ids) -> text\n"
    "  POST /v1/chat/completions  messages -> the assistant's reply (chat template)\n"
    "  GET  /v1/models            the model served\n"
    "  GET  /v1/models/ID         that model (404 for another id)\n"
    "  GET  /health               200 while the engine works, 503 after a failure\n"
    "  GET  /metrics              Prometheus text (queue, KV blocks, tokens)\n"
    "Both POSTs stream server-sent events with \"stream\": true.\n"
    "\n"
    "Options:\n"
    "      --host ADDR            address to bind (default 127.0.0.1; 0.0.0.0 = every interface)\n"
    "      --port N               TCP port (default 8000; 0 = any free port, printed)\n"
    "      --served-model-name S  the model's name in the API (default: from the model file)\n"
    "      --api-key KEY          require 'Authorization: Bearer KEY' on /v1/ routes\n"
    "      --max-tokens N         completions' default max_tokens (default 16, as OpenAI's)\n"
    "      --max-body BYTES       larger request bodies get 413 (default 16777216)\n"
    "      --max-prompt-bytes N   longer prompt text gets 400 before it is tokenized\n"
    "                             (default: the context length x 128)\n"
    "      --max-connections N    open connections (default 4096; each costs a socket, not a thread)\n"
    "      --idle-timeout SECONDS close a connection idle (or sending its request) that long\n"
    "                             (default 120; never while its answer is generated)\n"
    "      --parse-special-tokens read special-token markers (<|im_end|>, ...) in prompts and message\n"
    "                             content as the tokens they name, as transformers and vLLM do\n"
    "                             (default: as text, so a user cannot forge a turn)\n"
    "      --role ROLE            colocated (default), prefill or decode: disaggregated serving over the\n"
    "                             pipeline's kv_connector section; a decode server answers clients and\n"
    "                             fetches each prompt's KV from the prefill server (docs/disaggregation.md)\n"
    "      --set KEY=VALUE        override a pipeline key, e.g. scheduler.max_num_seqs=32\n"
    "  -h, --help                 this help\n"
    "\n"
    "Example:\n"
    "  loom serve configs/default.yaml --port 8000 &\n"
    "  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
    "       -d '{\"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]}'\n";

int loom_cmd_serve(int argc, char **argv) {
    const char *config = NULL;
    cli_sets sets;
    serve_options opt = {.host = "127.0.0.1", .port = 8000, .max_tokens = 16, .max_body = 16u << 20,
                         .max_connections = 4096, .idle_timeout = 120};
    if (!cli_sets_init(&sets, argc)) return LOOM_EXIT_FAIL;
    int rc = LOOM_EXIT_USAGE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        bool takes = !strcmp(a, "--host") || !strcmp(a, "--port") || !strcmp(a, "--served-model-name") ||
                     !strcmp(a, "--api-key") || !strcmp(a, "--max-tokens") || !strcmp(a, "--max-body") ||
                     !strcmp(a, "--max-prompt-bytes") || !strcmp(a, "--max-connections") || !strcmp(a, "--idle-timeout") ||
                     !strcmp(a, "--set") || !strcmp(a, "--role");
        if (takes && !v) {
            cli_usage_error("serve", serve_usage_text, "%s needs a value", a);
            goto out;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(serve_usage_text, stdout);
            rc = LOOM_EXIT_OK;
            goto out;
        } else if (!strcmp(a, "--host")) {
            opt.host = v;
        } else if (!strcmp(a, "--port")) {
            if (!cli_parse_long("serve", serve_usage_text, a, v, 0, 65535, &l)) goto out;
            opt.port = (int)l;
        } else if (!strcmp(a, "--served-model-name")) {
            opt.model_name = v;
        } else if (!strcmp(a, "--api-key")) {
            opt.api_key = v;
        } else if (!strcmp(a, "--max-tokens")) {
            if (!cli_parse_long("serve", serve_usage_text, a, v, 1, 1L << 30, &l)) goto out;
            opt.max_tokens = (int32_t)l;
        } else if (!strcmp(a, "--max-body")) {
            if (!cli_parse_long("serve", serve_usage_text, a, v, 1024, 1L << 30, &l)) goto out;
            opt.max_body = (size_t)l;
        } else if (!strcmp(a, "--max-prompt-bytes")) {
            if (!cli_parse_long("serve", serve_usage_text, a, v, 1, 1L << 40, &l)) goto out;
            opt.max_prompt_bytes = (size_t)l;
        } else if (!strcmp(a, "--max-connections")) {
            if (!cli_parse_long("serve", serve_usage_text, a, v, 1, 65536, &l)) goto out;
            opt.max_connections = (unsigned)l;
        } else if (!strcmp(a, "--idle-timeout")) {
            if (!cli_parse_long("serve", serve_usage_text, a, v, 1, 86400, &l)) goto out;
            opt.idle_timeout = (unsigned)l;
        } else if (!strcmp(a, "--role")) {
            if (!strcmp(v, "colocated")) opt.role = SERVE_ROLE_COLOCATED;
            else if (!strcmp(v, "prefill")) opt.role = SERVE_ROLE_PREFILL;
            else if (!strcmp(v, "decode")) opt.role = SERVE_ROLE_DECODE;
            else {
                cli_usage_error("serve", serve_usage_text, "--role '%s': use colocated, prefill or decode", v);
                goto out;
            }
        } else if (!strcmp(a, "--parse-special-tokens")) {
            opt.parse_special = true;
        } else if (!strcmp(a, "--set")) {
            cli_sets_add(&sets, v);
        } else if (!strncmp(a, "--set=", 6)) {
            cli_sets_add(&sets, a + 6);
        } else if (a[0] == '-' && a[1]) {
            cli_usage_error("serve", serve_usage_text, "unknown option '%s'", a);
            goto out;
        } else if (!config) {
            config = a;
        } else {
            cli_usage_error("serve", serve_usage_text, "unexpected argument '%s' (one CONFIG only)", a);
            goto out;
        }
        if (takes) i++;
    }
    if (!config) {
        cli_usage_error("serve", serve_usage_text, "no pipeline file given");
        goto out;
    }
    if (opt.api_key && !opt.api_key[0]) {
        cli_usage_error("serve", serve_usage_text, "--api-key is empty");
        goto out;
    }

    rc = LOOM_EXIT_FAIL;
    fprintf(stderr, "loom serve: loading %s ...\n", config);
    double secs;
    loom_engine *eng = cli_engine_open("serve", NULL, config, &sets, &secs);
    if (!eng) goto out;
    fprintf(stderr, "loom serve: loaded in %.1f s\n", secs);
    rc = serve_run(eng, &opt) == 0 ? LOOM_EXIT_OK : LOOM_EXIT_FAIL;
    loom_engine_destroy(eng);
out:
    cli_sets_free(&sets);
    return rc;
}
