/*
 * cli/cmd_perplexity.c — `loom perplexity CONFIG TEXTFILE`: the perplexity
 * of a text under the pipeline's model, to compare quantizers (and
 * backends) on the same text.
 *
 * Method: the whole file is tokenized once (with the model's BOS unless
 * --no-bos); the token stream is cut into non-overlapping windows of N
 * tokens (default min(context, 1024)), each scored teacher-forced with
 * loom_engine_score on a fresh sequence. Within a window every token but the
 * first is scored given the tokens before it in that window; the first
 * token of each window has no context and is not scored. Perplexity =
 * exp(-mean log p) over all scored tokens. A trailing window of one token
 * scores nothing and is dropped. --logprobs FILE also writes every scored
 * token's log-probability, one line each ("position<TAB>token<TAB>log p"),
 * so that two pipelines can be compared token by token (mean |difference|
 * does not cancel the way a perplexity difference can). Uses only the
 * public engine API.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "loom/engine.h"

static const char k_usage[] =
    "usage: loom perplexity CONFIG TEXTFILE [options]\n"
    "\n"
    "Perplexity of TEXTFILE under the model of the pipeline CONFIG: the text is\n"
    "tokenized once and cut into non-overlapping windows of N tokens; in each\n"
    "window every token after the first is scored given the ones before it\n"
    "(the first token of a window is context only). perplexity = exp(-mean\n"
    "log-probability) over the scored tokens.\n"
    "\n"
    "options:\n"
    "  -w, --window N       tokens per window (default: min(context, 1024))\n"
    "  -n, --max-tokens N   use only the first N tokens of the text\n"
    "      --no-bos         do not start the text with the model's BOS token\n"
    "  -s, --set KEY=VALUE  override a pipeline key, e.g. --set quantizer.mode=w8a8\n"
    "                       (repeatable)\n"
    "      --json           print one JSON object instead of text\n"
    "      --logprobs FILE  also write each scored token's log-probability to FILE,\n"
    "                       one line each: position in the text, token id, log p\n"
    "  -q, --quiet          no progress bar\n"
    "  -h, --help           this text\n"
    "\n"
    "example:\n"
    "  loom perplexity configs/quant/int8-w8a16.yaml data/text/us-founding-documents.txt\n";




/* "[#####.....] 3/7 windows, 2.1k tokens, ppl 12.34" on one stderr line. */
static void ppl_progress(int32_t done, int32_t total, int64_t scored, double nll) {
    cli_progress_bar(done, total);
    fprintf(stderr, "%d/%d windows, %lld tokens, ppl %.4f ", done, total,
            (long long)scored, scored > 0 ? exp(nll / (double)scored) : NAN);
    fflush(stderr);
}

int loom_cmd_perplexity(int argc, char **argv) {
    static const struct option opts[] = {
        {"window", required_argument, NULL, 'w'},
        {"max-tokens", required_argument, NULL, 'n'},
        {"no-bos", no_argument, NULL, 'B'},
        {"set", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"logprobs", required_argument, NULL, 'L'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    if (!sets) {
        fprintf(stderr, "loom perplexity: out of memory\n");
        return LOOM_EXIT_FAIL;
    }
    int nsets = 0, rc = LOOM_EXIT_FAIL;
    long window = 0, max_tokens = 0;
    bool json = false, quiet = false, bos = true;
    const char *lp_path = NULL;
    FILE *lp_out = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    float *lp = NULL;
    loom_engine *eng = NULL;
    opterr = 0;
    optind = 0; /* glibc: full re-initialisation */
    int ch;
    while ((ch = getopt_long(argc, argv, ":w:n:s:qh", opts, NULL)) != -1) {
        switch (ch) {
        case 'w':
            if (!cli_parse_long("perplexity", k_usage, "--window", optarg, 2, 1L << 24, &window)) goto usage;
            break;
        case 'n':
            if (!cli_parse_long("perplexity", k_usage, "--max-tokens", optarg, 2, 1L << 30, &max_tokens)) goto usage;
            break;
        case 'B': bos = false; break;
        case 's': sets[nsets++] = optarg; break;
        case 'j': json = true; break;
        case 'L': lp_path = optarg; break;
        case 'q': quiet = true; break;
        case 'h':
            fputs(k_usage, stdout);
            rc = LOOM_EXIT_OK;
            goto out;
        default: {
            char msg[256];
            cli_bad_option(ch, argv, msg, sizeof msg);
            cli_usage_error("perplexity", k_usage, "%s", msg);
            goto usage;
        }
        }
    }
    if (argc - optind != 2) {
        cli_usage_error("perplexity", k_usage, "expected CONFIG and TEXTFILE, got %d argument%s",
                        argc - optind, argc - optind == 1 ? "" : "s");
        goto usage;
    }
    const char *config = argv[optind], *path = argv[optind + 1];
    char why[512];
    if (!(text = cli_read_text_file(path, "perplexity", why, sizeof why))) {
        fprintf(stderr, "loom perplexity: %s\n", why);
        goto out;
    }

    if (lp_path && !(lp_out = fopen(lp_path, "w"))) {
        fprintf(stderr, "loom perplexity: cannot write --logprobs %s: %s\n", lp_path, strerror(errno));
        goto out;
    }

    loom_error err = {0};
    double t_load = cli_now();
    if (loom_engine_create(config, sets, nsets, &eng, &err) != LOOM_OK) {
        fprintf(stderr, "loom perplexity: %s\n", err.message);
        goto out;
    }
    t_load = cli_now() - t_load;
    int32_t n = 0;
    if (loom_engine_tokenize(eng, text, bos, &ids, &n, &err) != LOOM_OK) {
        fprintf(stderr, "loom perplexity: tokenizing %s: %s\n", path, err.message);
        goto out;
    }
    int32_t total = n;
    if (max_tokens > 0 && n > max_tokens) n = (int32_t)max_tokens;
    int32_t ctx = loom_engine_max_context(eng);
    if (window == 0) window = ctx < 1024 ? ctx : 1024;
    if (window > ctx) {
        fprintf(stderr,
                "loom perplexity: --window %ld exceeds the pipeline's context of %d tokens; use "
                "--window %d or raise engine.max_model_len\n",
                window, ctx, ctx);
        goto out;
    }
    if (n < 2) {
        fprintf(stderr, "loom perplexity: %s gives %d token%s; at least 2 are needed\n", path, n,
                n == 1 ? "" : "s");
        goto out;
    }
    int32_t nwin = (int32_t)((n + window - 1) / window);
    if (n - (int64_t)(nwin - 1) * window < 2) nwin--; /* a 1-token tail scores nothing */
    lp = malloc((size_t)window * sizeof *lp);
    if (!lp) {
        fprintf(stderr, "loom perplexity: out of memory\n");
        goto out;
    }
    bool bar = !quiet && isatty(2);
    double nll = 0.0, t0 = cli_now();
    int64_t scored = 0;
    for (int32_t w = 0; w < nwin; w++) {
        int32_t start = (int32_t)((int64_t)w * window);
        int32_t len = n - start < window ? n - start : (int32_t)window;
        if (bar) ppl_progress(w, nwin, scored, nll);
        if (loom_engine_score(eng, ids + start, len, lp, &err) != LOOM_OK) {
            if (bar) fputc('\n', stderr);
            fprintf(stderr, "loom perplexity: window %d (tokens %d..%d): %s\n", w, start,
                    start + len - 1, err.message);
            goto out;
        }
        for (int32_t i = 1; i < len; i++) nll -= (double)lp[i];
        if (lp_out)
            for (int32_t i = 1; i < len; i++)
                fprintf(lp_out, "%d\t%d\t%.9g\n", start + i, ids[start + i], (double)lp[i]);
        scored += len - 1;
    }
    double secs = cli_now() - t0;
    if (bar) {
        ppl_progress(nwin, nwin, scored, nll);
        fputc('\n', stderr);
    }
    double ppl = exp(nll / (double)scored);
    if (!isfinite(ppl)) {
        fprintf(stderr, "loom perplexity: perplexity is not finite (mean NLL %g); the model "
                        "produced non-finite log-probabilities\n", nll / (double)scored);
        goto out;
    }
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "config", config);
        cJSON_AddStringToObject(o, "text", path);
        cJSON_AddStringToObject(o, "model", loom_engine_model_name(eng));
        cJSON_AddNumberToObject(o, "text_tokens", total);
        cJSON_AddNumberToObject(o, "tokens", n);
        cJSON_AddNumberToObject(o, "scored", (double)scored);
        cJSON_AddNumberToObject(o, "windows", nwin);
        cJSON_AddNumberToObject(o, "window", (double)window);
        cJSON_AddNumberToObject(o, "mean_nll", nll / (double)scored);
        cJSON_AddNumberToObject(o, "perplexity", ppl);
        cJSON_AddNumberToObject(o, "load_seconds", t_load);
        cJSON_AddNumberToObject(o, "seconds", secs);
        cJSON_AddNumberToObject(o, "tokens_per_second", secs > 0 ? (double)n / secs : 0.0);
        char *s = cJSON_PrintUnformatted(o);
        if (s) puts(s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("model:      %s (%s)\n", loom_engine_model_name(eng), config);
        printf("text:       %s: %d tokens%s\n", path, total, bos ? " (with BOS)" : "");
        printf("scored:     %lld tokens in %d window%s of up to %ld (first token of each not "
               "scored)\n",
               (long long)scored, nwin, nwin == 1 ? "" : "s", window);
        printf("mean NLL:   %.6f nats\n", nll / (double)scored);
        printf("perplexity: %.4f\n", ppl);
        printf("time:       %.2f s load, %.2f s scoring (%.0f tokens/s)\n", t_load, secs,
               secs > 0 ? (double)n / secs : 0.0);
    }
    if (lp_out) {
        bool bad = ferror(lp_out) != 0;
        if (fclose(lp_out) != 0) bad = true;
        lp_out = NULL;
        if (bad) {
            fprintf(stderr, "loom perplexity: writing --logprobs %s failed\n", lp_path);
            goto out;
        }
    }
    rc = LOOM_EXIT_OK;
    goto out;
usage:
    rc = LOOM_EXIT_USAGE;
out:
    if (lp_out) fclose(lp_out);
    loom_engine_destroy(eng);
    free(lp);
    free(ids);
    free(text);
    free(sets);
    return rc;
}
