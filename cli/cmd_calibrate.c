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

int loom_cmd_calibrate(int argc, char **argv) {
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'},
        {"max-tokens", required_argument, NULL, 'n'},
        {"skip-tokens", required_argument, NULL, 'k'},
        {"window", required_argument, NULL, 'w'},
        {"no-bos", no_argument, NULL, 'B'},
        {"set", required_argument, NULL, 's'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    if (!sets) {
        fprintf(stderr, "loom calibrate: out of memory\n");
        return LOOM_EXIT_FAIL;
    }
    int nsets = 0, rc = LOOM_EXIT_FAIL;
    long window = 0, max_tokens = 0, skip = 0;
    bool quiet = false, bos = true, observing = false;
    const char *out_path = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    float *lp = NULL;
    loom_engine *eng = NULL;
    cal_state cs = {0};
    loom_error err = {0};
    opterr = 0;
    optind = 0; /* glibc: full re-initialisation */
    int ch;
    while ((ch = getopt_long(argc, argv, ":o:n:k:w:s:qh", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': out_path = optarg; break;
        case 'n':
            if (!cli_parse_long("calibrate", k_usage, "--max-tokens", optarg, 2, 1L << 30, &max_tokens)) goto usage;
            break;
        case 'k':
            if (!cli_parse_long("calibrate", k_usage, "--skip-tokens", optarg, 0, 1L << 30, &skip)) goto usage;
            break;
        case 'w':
            if (!cli_parse_long("calibrate", k_usage, "--window", optarg, 2, 1L << 24, &window)) goto usage;
            break;
        case 'B': bos = false; break;
        case 's': sets[nsets++] = optarg; break;
        case 'q': quiet = true; break;
        case 'h':
            fputs(k_usage, stdout);
            rc = LOOM_EXIT_OK;
            goto out;
        default: {
            char msg[256];
            cli_bad_option(ch, argv, msg, sizeof msg);
            cli_usage_error("calibrate", k_usage, "%s", msg);
            goto usage;
        }
        }
    }
    if (argc - optind != 2) {
        cli_usage_error("calibrate", k_usage, "expected CONFIG and TEXTFILE, got %d argument%s",
                        argc - optind, argc - optind == 1 ? "" : "s");
        goto usage;
    }
    if (!out_path || !out_path[0]) {
        cli_usage_error("calibrate", k_usage, "--out FILE is required");
        goto usage;
    }
    const char *config = argv[optind], *path = argv[optind + 1];
    char why[512];
    if (!(text = cli_read_text_file(path, "calibration", why, sizeof why))) {
        fprintf(stderr, "loom calibrate: %s\n", why);
        goto out;
    }
    if (!cal_check_float(config, sets, nsets)) goto out;
    if (loom_engine_create(config, sets, nsets, &eng, &err) != LOOM_OK) {
        fprintf(stderr, "loom calibrate: %s\n", err.message);
        goto out;
    }
    int32_t n = 0;
    if (loom_engine_tokenize(eng, text, bos, &ids, &n, &err) != LOOM_OK) {
        fprintf(stderr, "loom calibrate: tokenizing %s: %s\n", path, err.message);
        goto out;
    }
    if (n - skip < 2) {
        fprintf(stderr, "loom calibrate: %s gives %d tokens; --skip-tokens %ld leaves %ld (at "
                "least 2 are needed)\n", path, n, skip, n - skip < 0 ? 0 : n - skip);
        goto out;
    }
    int32_t total = n - (int32_t)skip;
    if (max_tokens > 0 && total > max_tokens) total = (int32_t)max_tokens;
    int32_t ctx = loom_engine_max_context(eng);
    if (window == 0) window = ctx < 1024 ? ctx : 1024;
    if (window > ctx) {
        fprintf(stderr, "loom calibrate: --window %ld exceeds the pipeline's context of %d tokens\n",
                window, ctx);
        goto out;
    }
    loom_act_observer obs = {.struct_size = sizeof obs, .ctx = &cs, .record = cal_record};
    if (loom_engine_set_observer(eng, &obs, &err) != LOOM_OK) {
        fprintf(stderr, "loom calibrate: %s\n", err.message);
        goto out;
    }
    observing = true;
    if (!(lp = malloc((size_t)window * sizeof *lp))) {
        fprintf(stderr, "loom calibrate: out of memory\n");
        goto out;
    }
    bool bar = !quiet && isatty(2);
    for (int32_t done = 0; done < total;) {
        int32_t len = total - done < window ? total - done : (int32_t)window;
        if (bar) cal_progress(done, total);
        if (loom_engine_score(eng, ids + skip + done, len, lp, &err) != LOOM_OK) {
            if (bar) fputc('\n', stderr);
            fprintf(stderr, "loom calibrate: tokens %ld..%ld: %s\n", skip + done,
                    skip + done + len - 1, err.message);
            goto out;
        }
        done += len;
        if (cs.failed) break;
    }
    if (bar) {
        cal_progress(total, total);
        fputc('\n', stderr);
    }
    if (cs.failed) {
        fprintf(stderr, "loom calibrate: %s\n", cs.why);
        goto out;
    }
    if (cs.n == 0) {
        fprintf(stderr, "loom calibrate: the backend reported no activations\n");
        goto out;
    }
    /* one record per weight; the weights of a group share their vector */
    qc_calib c = {.tokens = (uint64_t)total};
    int32_t nrec = 0;
    for (int32_t i = 0; i < cs.n; i++) nrec += cs.g[i].nnames;
    if (!(c.e = calloc((size_t)nrec, sizeof *c.e))) {
        fprintf(stderr, "loom calibrate: out of memory\n");
        goto out;
    }
    for (int32_t i = 0; i < cs.n; i++) {
        for (int32_t j = 0; j < cs.g[i].cols; j++)
            if (!isfinite(cs.g[i].amax[j])) {
                fprintf(stderr, "loom calibrate: the input of '%s' has a non-finite value in "
                        "channel %d: the model produced NaN/inf on this text\n",
                        cs.g[i].names[0], (int)j);
                free(c.e);
                goto out;
            }
        for (int32_t k = 0; k < cs.g[i].nnames; k++) {
            qc_calib_entry *e = &c.e[c.count++];
            memcpy(e->name, cs.g[i].names[k], QC_CALIB_NAME_MAX);
            e->cols = cs.g[i].cols;
            e->amax = cs.g[i].amax;
        }
    }
    bool ok = qc_calib_write(out_path, &c, why, sizeof why);
    free(c.e); /* the vectors belong to cs */
    if (!ok) {
        fprintf(stderr, "loom calibrate: %s\n", why);
        goto out;
    }
    printf("model:   %s (%s)\n", loom_engine_model_name(eng), config);
    printf("text:    %s: tokens %ld..%ld of %d%s\n", path, skip, skip + total - 1, n,
           bos ? " (with BOS)" : "");
    printf("wrote:   %s: %d weights (%d distinct inputs), max |x| per input channel over %d "
           "tokens\n", out_path, c.count, cs.n, total);
    rc = LOOM_EXIT_OK;
    goto out;
usage:
    rc = LOOM_EXIT_USAGE;
out:
    if (observing) loom_engine_set_observer(eng, NULL, NULL);
    loom_engine_destroy(eng);
    for (int32_t i = 0; i < cs.n; i++) free(cs.g[i].amax);
    free(cs.g);
    free(lp);
    free(ids);
    free(text);
    free(sets);
    return rc;
}
