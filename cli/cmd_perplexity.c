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
#include "engine_setup.h"
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

/* What perplexity adds to the shared text options. */
typedef struct ppl_opts {
    bool json;                 /* --json                                     */
    const char *lp_path;       /* --logprobs FILE, or NULL                   */
} ppl_opts;

/* The tokens scored and what scoring them gave. */
typedef struct ppl_sum {
    int32_t total;             /* tokens of the whole text                   */
    int32_t n;                 /* tokens used (--max-tokens)                 */
    long window;               /* tokens per window                          */
    int32_t nwin;              /* windows scored                             */
    int64_t scored;            /* tokens scored: each window's but the first */
    double nll;                /* -sum of their log-probabilities, nats      */
    double load_secs, secs;    /* building the engine; scoring               */
} ppl_sum;

/* "[#####.....] 3/7 windows, 2.1k tokens, ppl 12.34" on one stderr line. */
static void ppl_progress(int32_t done, int32_t total, int64_t scored, double nll) {
    cli_progress_bar(done, total);
    fprintf(stderr, "%d/%d windows, %lld tokens, ppl %.4f ", done, total,
            (long long)scored, scored > 0 ? exp(nll / (double)scored) : NAN);
    fflush(stderr);
}

/* Options and arguments: -1 to go on, else the exit code. */
static int ppl_parse(cli_text_args *a, ppl_opts *p, int argc, char **argv) {
    static const struct option opts[] = {
        CLI_TEXT_LONG_OPTIONS,
        {"json", no_argument, NULL, 'j'},
        {"logprobs", required_argument, NULL, 'L'},
        {0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, ":" CLI_TEXT_OPTSTRING, opts, NULL)) != -1) {
        if (ch == 'j') {
            p->json = true;
            continue;
        }
        if (ch == 'L') {
            p->lp_path = optarg;
            continue;
        }
        cli_opt r = cli_text_option(a, ch, argv);
        if (r == CLI_OPT_HELP) return LOOM_EXIT_OK;
        if (r == CLI_OPT_USAGE) return LOOM_EXIT_USAGE;
    }
    return cli_text_positionals(a, argc, argv) ? -1 : LOOM_EXIT_USAGE;
}

/* The windows for s->n tokens: cut at --max-tokens, the window fitting the
 * context, at least 2 tokens. false after a message. */
static bool ppl_plan(const cli_text_args *a, loom_engine *eng, ppl_sum *s) {
    if (a->max_tokens > 0 && s->n > a->max_tokens) s->n = (int32_t)a->max_tokens;
    int32_t ctx = loom_engine_max_context(eng);
    s->window = cli_window_or_default(a->window, ctx);
    if (s->window > ctx) {
        fprintf(stderr,
                "loom perplexity: --window %ld exceeds the pipeline's context of %d tokens; use "
                "--window %d or raise engine.max_model_len\n",
                s->window, ctx, ctx);
        return false;
    }
    if (s->n < 2) {
        fprintf(stderr, "loom perplexity: %s gives %d token%s; at least 2 are needed\n", a->path, s->n,
                s->n == 1 ? "" : "s");
        return false;
    }
    s->nwin = (int32_t)((s->n + s->window - 1) / s->window);
    if (s->n - (int64_t)(s->nwin - 1) * s->window < 2) s->nwin--; /* a 1-token tail scores nothing */
    return true;
}

/* Score every window, summing the NLL and writing each scored token's log p
 * to lp_out (may be NULL). false after a message. */
static bool ppl_score(const cli_text_args *a, loom_engine *eng, const int32_t *ids, FILE *lp_out, ppl_sum *s) {
    float *lp = malloc((size_t)s->window * sizeof *lp);
    if (!lp) {
        fprintf(stderr, "loom perplexity: out of memory\n");
        return false;
    }
    bool bar = !a->quiet && isatty(2), ok = true;
    double t0 = cli_now();
    loom_error err = {0};
    for (int32_t w = 0; w < s->nwin; w++) {
        int32_t start = (int32_t)((int64_t)w * s->window);
        int32_t len = s->n - start < s->window ? s->n - start : (int32_t)s->window;
        if (bar) ppl_progress(w, s->nwin, s->scored, s->nll);
        if (loom_engine_score(eng, ids + start, len, lp, &err) != LOOM_OK) {
            if (bar) fputc('\n', stderr);
            fprintf(stderr, "loom perplexity: window %d (tokens %d..%d): %s\n", w, start,
                    start + len - 1, err.message);
            ok = false;
            goto free_lp;
        }
        for (int32_t i = 1; i < len; i++) s->nll -= (double)lp[i];
        if (lp_out)
            for (int32_t i = 1; i < len; i++)
                fprintf(lp_out, "%d\t%d\t%.9g\n", start + i, ids[start + i], (double)lp[i]);
        s->scored += len - 1;
    }
    s->secs = cli_now() - t0;
    if (bar) {
        ppl_progress(s->nwin, s->nwin, s->scored, s->nll);
        fputc('\n', stderr);
    }
free_lp:
    free(lp);
    return ok;
}

static void ppl_print_json(const cli_text_args *a, loom_engine *eng, const ppl_sum *s, double ppl) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "config", a->config);
    cJSON_AddStringToObject(o, "text", a->path);
    cJSON_AddStringToObject(o, "model", loom_engine_model_name(eng));
    cJSON_AddNumberToObject(o, "text_tokens", s->total);
    cJSON_AddNumberToObject(o, "tokens", s->n);
    cJSON_AddNumberToObject(o, "scored", (double)s->scored);
    cJSON_AddNumberToObject(o, "windows", s->nwin);
    cJSON_AddNumberToObject(o, "window", (double)s->window);
    cJSON_AddNumberToObject(o, "mean_nll", s->nll / (double)s->scored);
    cJSON_AddNumberToObject(o, "perplexity", ppl);
    cJSON_AddNumberToObject(o, "load_seconds", s->load_secs);
    cJSON_AddNumberToObject(o, "seconds", s->secs);
    cJSON_AddNumberToObject(o, "tokens_per_second", s->secs > 0 ? (double)s->n / s->secs : 0.0);
    char *text = cJSON_PrintUnformatted(o);
    if (text) puts(text);
    free(text);
    cJSON_Delete(o);
}

static void ppl_print_text(const cli_text_args *a, loom_engine *eng, const ppl_sum *s, double ppl) {
    printf("model:      %s (%s)\n", loom_engine_model_name(eng), a->config);
    printf("text:       %s: %d tokens%s\n", a->path, s->total, a->bos ? " (with BOS)" : "");
    printf("scored:     %lld tokens in %d window%s of up to %ld (first token of each not "
           "scored)\n",
           (long long)s->scored, s->nwin, s->nwin == 1 ? "" : "s", s->window);
    printf("mean NLL:   %.6f nats\n", s->nll / (double)s->scored);
    printf("perplexity: %.4f\n", ppl);
    printf("time:       %.2f s load, %.2f s scoring (%.0f tokens/s)\n", s->load_secs, s->secs,
           s->secs > 0 ? (double)s->n / s->secs : 0.0);
}

/* Close the --logprobs file; false after a message when writing it failed. */
static bool ppl_close_logprobs(FILE *f, const char *path) {
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = true;
    if (bad) fprintf(stderr, "loom perplexity: writing --logprobs %s failed\n", path);
    return !bad;
}

/* Read, tokenize, score and report; the exit code. */
static int ppl_run(const cli_text_args *a, const ppl_opts *p) {
    int rc = LOOM_EXIT_FAIL;
    FILE *lp_out = NULL;
    loom_engine *eng = NULL;
    int32_t *ids = NULL;
    ppl_sum s = {0};
    char *text = cli_text_read(a, "perplexity");
    if (!text) return LOOM_EXIT_FAIL;
    if (p->lp_path && !(lp_out = fopen(p->lp_path, "w"))) {
        fprintf(stderr, "loom perplexity: cannot write --logprobs %s: %s\n", p->lp_path, strerror(errno));
        goto free_all;
    }
    if (!(eng = cli_engine_open("perplexity", NULL, a->config, &a->sets, &s.load_secs))) goto free_all;
    if (!cli_engine_tokenize("perplexity", eng, text, a->path, a->bos, &ids, &s.n)) goto free_all;
    s.total = s.n;
    if (!ppl_plan(a, eng, &s) || !ppl_score(a, eng, ids, lp_out, &s)) goto free_all;
    double ppl = exp(s.nll / (double)s.scored);
    if (!isfinite(ppl)) {
        fprintf(stderr, "loom perplexity: perplexity is not finite (mean NLL %g); the model "
                        "produced non-finite log-probabilities\n", s.nll / (double)s.scored);
        goto free_all;
    }
    if (p->json) ppl_print_json(a, eng, &s, ppl);
    else ppl_print_text(a, eng, &s, ppl);
    FILE *f = lp_out;
    lp_out = NULL;
    if (f && !ppl_close_logprobs(f, p->lp_path)) goto free_all;
    rc = LOOM_EXIT_OK;
free_all:
    if (lp_out) fclose(lp_out);
    loom_engine_destroy(eng);
    free(ids);
    free(text);
    return rc;
}

int loom_cmd_perplexity(int argc, char **argv) {
    cli_text_args a;
    ppl_opts p = {0};
    int rc = LOOM_EXIT_FAIL;
    if (!cli_text_args_init(&a, "perplexity", k_usage, argc)) {
        fprintf(stderr, "loom perplexity: out of memory\n");
        goto free_args;
    }
    rc = ppl_parse(&a, &p, argc, argv);
    if (rc < 0) rc = ppl_run(&a, &p);
free_args:
    cli_text_args_free(&a);
    return rc;
}
