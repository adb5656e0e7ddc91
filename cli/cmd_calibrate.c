/*
 * cli/cmd_calibrate.c — `loom calibrate CONFIG TEXTFILE --out FILE`: the
 * activation statistics SmoothQuant needs (quantizer int8, mode w8a8,
 * smoothquant > 0, calibration: FILE).
 *
 * The pipeline's float model reads a slice of the text — tokenized once,
 * tokens [--skip-tokens, --skip-tokens + --max-tokens), in windows scored
 * teacher-forced as `loom perplexity` does — while an activation observer
 * (loom_act_observer, installed with loom_engine_set_observer) sees the
 * input of every decoder linear layer; for each weight the file gets the
 * per-input-channel max |x| over all tokens of the slice. Format:
 * plugins/quantizer/common/qcalib.h. The pipeline must have no quantizer
 * (the statistics are of the float model) and a backend that can record
 * (cpu).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../plugins/quantizer/common/qcalib.h"
#include "commands.h"
#include "engine_setup.h"
#include "loom/backend.h"
#include "loom/engine.h"
#include "pipeline/pipeline.h"

static const char k_usage[] =
    "usage: loom calibrate CONFIG TEXTFILE --out FILE [options]\n"
    "\n"
    "Record the activation statistics SmoothQuant needs: run the float model of\n"
    "the pipeline CONFIG (no quantizer; cpu backend) over TEXTFILE and write, for\n"
    "every linear weight of every decoder layer, the maximum |x| of each input\n"
    "channel over the calibration tokens. Use the file with\n"
    "  quantizer: {plugin: int8, mode: w8a8, smoothquant: 0.5, calibration: FILE}\n"
    "Calibrate on text you will not score (another text, or --skip-tokens).\n"
    "\n"
    "options:\n"
    "  -o, --out FILE        where to write the statistics (required)\n"
    "  -n, --max-tokens N    use at most N tokens (default: all; a few hundred suffice)\n"
    "  -k, --skip-tokens N   start at token N of the tokenized text (default 0)\n"
    "  -w, --window N        tokens per forward pass (default: min(context, 1024))\n"
    "      --no-bos          do not start the text with the model's BOS token\n"
    "  -s, --set KEY=VALUE   override a pipeline key (repeatable)\n"
    "  -q, --quiet           no progress bar\n"
    "  -h, --help            this text\n"
    "\n"
    "file format: plugins/quantizer/common/qcalib.h (docs/quantization.md)\n"
    "\n"
    "example:\n"
    "  loom calibrate configs/default.yaml data/text/us-founding-documents.txt \\\n"
    "      --skip-tokens 2048 --max-tokens 1024 --out smollm2.act\n";

/* One observed input: the weights that read it and its running maxima. */
typedef struct cal_group {
    char names[4][QC_CALIB_NAME_MAX];
    int32_t nnames;
    int64_t cols;
    float *amax;               /* (cols)                                     */
} cal_group;

typedef struct cal_state {
    cal_group *g;
    int32_t n, cap;
    bool failed;               /* out of memory or a width that changed      */
    char why[512];
} cal_state;

static void cal_record(void *ctx, const char *const *names, int32_t num_names, const float *x,
                       int64_t ldx, int64_t rows, int64_t cols) {
    cal_state *c = ctx;
    if (c->failed || num_names < 1) return;
    cal_group *g = NULL;
    for (int32_t i = 0; i < c->n && !g; i++)
        if (!strcmp(c->g[i].names[0], names[0])) g = &c->g[i];
    if (!g) {
        if (c->n == c->cap) {
            int32_t cap = c->cap ? 2 * c->cap : 64;
            cal_group *p = realloc(c->g, (size_t)cap * sizeof *p);
            if (!p) goto nomem;
            c->g = p;
            c->cap = cap;
        }
        g = &c->g[c->n];
        memset(g, 0, sizeof *g);
        if (!(g->amax = calloc((size_t)cols, sizeof(float)))) goto nomem;
        g->cols = cols;
        g->nnames = num_names < 4 ? num_names : 4;
        for (int32_t i = 0; i < g->nnames; i++) snprintf(g->names[i], QC_CALIB_NAME_MAX, "%s", names[i]);
        c->n++;
    }
    if (g->cols != cols) {
        c->failed = true;
        snprintf(c->why, sizeof c->why, "the input of '%s' changed width (%lld, then %lld)",
                 names[0], (long long)g->cols, (long long)cols);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * ldx;
        for (int64_t j = 0; j < cols; j++) {
            float a = fabsf(row[j]);
            if (a > g->amax[j] || a != a) g->amax[j] = a; /* NaN is kept, then refused */
        }
    }
    return;
nomem:
    c->failed = true;
    snprintf(c->why, sizeof c->why, "out of memory for the statistics");
}

static void cal_progress(int64_t done, int64_t total) {
    cli_progress_bar(done, total);
    fprintf(stderr, "%lld/%lld tokens ", (long long)done, (long long)total);
    fflush(stderr);
}

/* Refuse a pipeline with a quantizer: its activations are not the float
 * model's. */
static bool cal_check_float(const char *config, const char *const *sets, int nsets) {
    loom_diag diag;
    loom_diag_init(&diag);
    loom_pipeline *p = NULL;
    bool ok = true;
    if (loom_pipeline_load(config, sets, nsets, &p, &diag) != LOOM_OK) {
        loom_diag_print(&diag, stderr);
        ok = false;
    } else {
        const loom_pipeline_slot *q = loom_pipeline_slot_get(p, LOOM_KIND_QUANTIZER);
        if (q) {
            fprintf(stderr,
                    "loom calibrate: %s has a quantizer (%s): SmoothQuant statistics are those "
                    "of the float model; calibrate with the pipeline without its quantizer: "
                    "section (e.g. configs/default.yaml)\n",
                    config, q->name);
            ok = false;
        }
        loom_pipeline_destroy(p);
    }
    loom_diag_free(&diag);
    return ok;
}

/* What calibrate adds to the shared text options. */
typedef struct cal_opts {
    const char *out_path;      /* -o, --out FILE                    */
    long skip;                 /* -k, --skip-tokens N               */
} cal_opts;

/* Options and arguments: -1 to go on, else the exit code. */
static int cal_parse(cli_text_args *a, cal_opts *c, int argc, char **argv) {
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'},
        {"skip-tokens", required_argument, NULL, 'k'},
        CLI_TEXT_LONG_OPTIONS,
        {0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, ":o:k:" CLI_TEXT_OPTSTRING, opts, NULL)) != -1) {
        if (ch == 'o') {
            c->out_path = optarg;
            continue;
        }
        if (ch == 'k') {
            if (!cli_parse_long("calibrate", k_usage, "--skip-tokens", optarg, 0, 1L << 30, &c->skip))
                return LOOM_EXIT_USAGE;
            continue;
        }
        cli_opt r = cli_text_option(a, ch, argv);
        if (r == CLI_OPT_HELP) return LOOM_EXIT_OK;
        if (r == CLI_OPT_USAGE) return LOOM_EXIT_USAGE;
    }
    if (!cli_text_positionals(a, argc, argv)) return LOOM_EXIT_USAGE;
    if (!c->out_path || !c->out_path[0]) {
        cli_usage_error("calibrate", k_usage, "--out FILE is required");
        return LOOM_EXIT_USAGE;
    }
    return -1;
}

/* Tokens [skip, skip + *total) of the n: at least 2, at most --max-tokens,
 * and the window fitting the context. false after a message. */
static bool cal_plan(const cli_text_args *a, const cal_opts *c, loom_engine *eng, int32_t n, int32_t *total,
                     long *window) {
    if (n - c->skip < 2) {
        fprintf(stderr, "loom calibrate: %s gives %d tokens; --skip-tokens %ld leaves %ld (at "
                "least 2 are needed)\n", a->path, n, c->skip, n - c->skip < 0 ? 0 : n - c->skip);
        return false;
    }
    *total = n - (int32_t)c->skip;
    if (a->max_tokens > 0 && *total > a->max_tokens) *total = (int32_t)a->max_tokens;
    int32_t ctx = loom_engine_max_context(eng);
    *window = cli_window_or_default(a->window, ctx);
    if (*window > ctx) {
        fprintf(stderr, "loom calibrate: --window %ld exceeds the pipeline's context of %d tokens\n",
                *window, ctx);
        return false;
    }
    return true;
}

/* Score tokens ids[0, total) in windows while the observer records; stops
 * early when it failed. false after a message. */
static bool cal_observe(const cli_text_args *a, loom_engine *eng, const int32_t *ids, long skip, int32_t total,
                        long window, const cal_state *cs) {
    float *lp = malloc((size_t)window * sizeof *lp);
    if (!lp) {
        fprintf(stderr, "loom calibrate: out of memory\n");
        return false;
    }
    bool bar = !a->quiet && isatty(2), ok = true;
    loom_error err = {0};
    for (int32_t done = 0; done < total;) {
        int32_t len = total - done < window ? total - done : (int32_t)window;
        if (bar) cal_progress(done, total);
        if (loom_engine_score(eng, ids + done, len, lp, &err) != LOOM_OK) {
            if (bar) fputc('\n', stderr);
            fprintf(stderr, "loom calibrate: tokens %ld..%ld: %s\n", skip + done,
                    skip + done + len - 1, err.message);
            ok = false;
            goto free_lp;
        }
        done += len;
        if (cs->failed) break;
    }
    if (bar) {
        cal_progress(total, total);
        fputc('\n', stderr);
    }
free_lp:
    free(lp);
    return ok;
}

/* Write the statistics: one record per weight; the weights of a group share
 * their vector. A non-finite maximum is refused. false after a message. */
static bool cal_write(const cal_state *cs, const char *out_path, int32_t total, int32_t *nrec) {
    qc_calib c = {.tokens = (uint64_t)total};
    char why[512];
    bool ok = false;
    *nrec = 0;
    for (int32_t i = 0; i < cs->n; i++) *nrec += cs->g[i].nnames;
    if (!(c.e = calloc((size_t)*nrec, sizeof *c.e))) {
        fprintf(stderr, "loom calibrate: out of memory\n");
        return false;
    }
    for (int32_t i = 0; i < cs->n; i++) {
        for (int32_t j = 0; j < cs->g[i].cols; j++)
            if (!isfinite(cs->g[i].amax[j])) {
                fprintf(stderr, "loom calibrate: the input of '%s' has a non-finite value in "
                        "channel %d: the model produced NaN/inf on this text\n",
                        cs->g[i].names[0], (int)j);
                goto free_entries;
            }
        for (int32_t k = 0; k < cs->g[i].nnames; k++) {
            qc_calib_entry *e = &c.e[c.count++];
            memcpy(e->name, cs->g[i].names[k], QC_CALIB_NAME_MAX);
            e->cols = cs->g[i].cols;
            e->amax = cs->g[i].amax;
        }
    }
    ok = qc_calib_write(out_path, &c, why, sizeof why);
    if (!ok) fprintf(stderr, "loom calibrate: %s\n", why);
free_entries:
    free(c.e); /* the vectors belong to cs */
    return ok;
}

/* Check, build, tokenize, observe, write and report; the exit code. */
static int cal_run(const cli_text_args *a, const cal_opts *c) {
    int rc = LOOM_EXIT_FAIL;
    loom_engine *eng = NULL;
    int32_t *ids = NULL, n = 0, total, nrec;
    long window;
    cal_state cs = {0};
    loom_error err = {0};
    char *text = cli_text_read(a, "calibration");
    if (!text) return LOOM_EXIT_FAIL;
    if (!cal_check_float(a->config, a->sets.v, a->sets.n)) goto free_all;
    if (!(eng = cli_engine_open("calibrate", NULL, a->config, &a->sets, NULL))) goto free_all;
    if (!cli_engine_tokenize("calibrate", eng, text, a->path, a->bos, &ids, &n)) goto free_all;
    if (!cal_plan(a, c, eng, n, &total, &window)) goto free_all;
    loom_act_observer obs = {.struct_size = sizeof obs, .ctx = &cs, .record = cal_record};
    if (loom_engine_set_observer(eng, &obs, &err) != LOOM_OK) {
        fprintf(stderr, "loom calibrate: %s\n", err.message);
        goto free_all;
    }
    bool observed = cal_observe(a, eng, ids + c->skip, c->skip, total, window, &cs);
    loom_engine_set_observer(eng, NULL, NULL);
    if (!observed) goto free_all;
    if (cs.failed) {
        fprintf(stderr, "loom calibrate: %s\n", cs.why);
        goto free_all;
    }
    if (cs.n == 0) {
        fprintf(stderr, "loom calibrate: the backend reported no activations\n");
        goto free_all;
    }
    if (!cal_write(&cs, c->out_path, total, &nrec)) goto free_all;
    printf("model:   %s (%s)\n", loom_engine_model_name(eng), a->config);
    printf("text:    %s: tokens %ld..%ld of %d%s\n", a->path, c->skip, c->skip + total - 1, n,
           a->bos ? " (with BOS)" : "");
    printf("wrote:   %s: %d weights (%d distinct inputs), max |x| per input channel over %d "
           "tokens\n", c->out_path, nrec, cs.n, total);
    rc = LOOM_EXIT_OK;
free_all:
    loom_engine_destroy(eng);
    for (int32_t i = 0; i < cs.n; i++) free(cs.g[i].amax);
    free(cs.g);
    free(ids);
    free(text);
    return rc;
}

int loom_cmd_calibrate(int argc, char **argv) {
    cli_text_args a;
    cal_opts c = {0};
    int rc = LOOM_EXIT_FAIL;
    if (!cli_text_args_init(&a, "calibrate", k_usage, argc)) {
        fprintf(stderr, "loom calibrate: out of memory\n");
        goto free_args;
    }
    rc = cal_parse(&a, &c, argc, argv);
    if (rc < 0) rc = cal_run(&a, &c);
free_args:
    cli_text_args_free(&a);
    return rc;
}
