/*
 * cli/cmd_run.c — `loom run CONFIG`: generate text from a prompt with the
 * engine a pipeline describes, streaming or at the end, and report prefill
 * and decode speed. Uses only the public engine API (loom/engine.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "engine_setup.h"
#include "loom/engine.h"

static void run_usage(FILE *f) {
    fputs("Usage: loom run CONFIG [options]\n"
          "\n"
          "Generate text with the engine described by the pipeline file CONFIG.\n"
          "\n"
          "Options:\n"
          "  -p, --prompt TEXT          prompt text (default: read stdin)\n"
          "      --prompt-file FILE     read the prompt from FILE\n"
          "      --chat                 wrap the prompt in the model's chat template\n"
          "      --system TEXT          chat system prompt (default: the template's)\n"
          "  -n, --max-tokens N         new tokens at most (default 128)\n"
          "      --temperature T        0 = greedy (default 0)\n"
          "      --top-p P              nucleus sampling (default 1 = off)\n"
          "      --top-k K              keep the K most likely (default 0 = off)\n"
          "      --min-p P              drop tokens below P x the top probability\n"
          "      --repetition-penalty R CTRL-style penalty (default 1 = off)\n"
          "      --presence-penalty X   OpenAI presence penalty (default 0)\n"
          "      --frequency-penalty X  OpenAI frequency penalty (default 0)\n"
          "      --seed S               sampling seed (same seed, same text)\n"
          "      --samples N            independent samples of the prompt (default 1)\n"
          "      --stop STR             stop when STR is generated (repeatable)\n"
          "      --ignore-eos           keep going past end-of-generation tokens\n"
          "      --stream               print tokens as they are generated\n"
          "      --set KEY=VALUE        override a pipeline key, e.g. scheduler.max_num_seqs=8\n"
          "  -q, --quiet                print only the generated text\n"
          "  -h, --help                 this help\n"
          "\n"
          "Example:\n"
          "  loom run configs/default.yaml --chat -p 'What is the capital of France?'\n",
          f);
}

typedef struct run_state {
    bool stream;
    int32_t samples;
    char **text;     /* per sample, when not streaming */
    size_t *len;
    int32_t generated;
    loom_finish_reason *finish;
    char error[512];
} run_state;

static void on_token(void *user, const loom_token_event *ev) {
    run_state *rs = user;
    if (ev->token >= 0) rs->generated++;
    if (ev->finish == LOOM_FINISH_ERROR && ev->error)
        snprintf(rs->error, sizeof rs->error, "%s", ev->error);
    if (ev->finish != LOOM_FINISH_NONE) rs->finish[ev->sample_index] = ev->finish;
    /* by length: generated text may hold NUL characters */
    size_t n = ev->text ? ev->text_len : 0;
    if (n == 0) return;
    if (rs->stream && rs->samples == 1) {
        fwrite(ev->text, 1, n, stdout);
        fflush(stdout);
        return;
    }
    int32_t k = ev->sample_index;
    char *t = realloc(rs->text[k], rs->len[k] + n + 1);
    if (!t) return;
    memcpy(t + rs->len[k], ev->text, n);
    t[rs->len[k] + n] = 0;
    rs->text[k] = t;
    rs->len[k] += n;
}

static char *read_all(FILE *f) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    size_t r;
    while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n < 2) {
            char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                return NULL;
            }
            buf = b;
        }
    }
    buf[n] = 0;
    return buf;
}

static bool parse_num(const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double d = v ? strtod(v, &end) : 0;
    if (!v || errno || end == v || *end || d < lo || d > hi) {
        fprintf(stderr, "loom run: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, v ? v : "");
        return false;
    }
    *out = d;
    return true;
}

static const char *finish_name(loom_finish_reason f) {
    switch (f) {
    case LOOM_FINISH_EOS: return "end of generation";
    case LOOM_FINISH_STOP: return "stop string";
    case LOOM_FINISH_LENGTH: return "length";
    case LOOM_FINISH_ABORT: return "aborted";
    case LOOM_FINISH_ERROR: return "error";
    default: return "running";
    }
}

/* The numeric options: their bounds, and (run_set_num) the field each sets. */
enum { RN_MAX_TOKENS, RN_TEMPERATURE, RN_TOP_P, RN_TOP_K, RN_MIN_P, RN_REPETITION, RN_PRESENCE, RN_FREQUENCY,
       RN_SEED, RN_SAMPLES, RN_COUNT };
static const struct run_num_opt {
    const char *name, *alias;
    double lo, hi;
} k_num_opts[RN_COUNT] = {
    [RN_MAX_TOKENS] = {"--max-tokens", "-n", 1, 1e9},
    [RN_TEMPERATURE] = {"--temperature", NULL, 0, 100},
    [RN_TOP_P] = {"--top-p", NULL, 1e-9, 1},
    [RN_TOP_K] = {"--top-k", NULL, 0, 1e9},
    [RN_MIN_P] = {"--min-p", NULL, 0, 1},
    [RN_REPETITION] = {"--repetition-penalty", NULL, 1e-3, 100},
    [RN_PRESENCE] = {"--presence-penalty", NULL, -10, 10},
    [RN_FREQUENCY] = {"--frequency-penalty", NULL, -10, 10},
    [RN_SEED] = {"--seed", NULL, 0, 1.8e19},
    [RN_SAMPLES] = {"--samples", NULL, 1, 64},
};

static int run_num_index(const char *a) {
    for (int k = 0; k < RN_COUNT; k++)
        if (!strcmp(a, k_num_opts[k].name) || (k_num_opts[k].alias && !strcmp(a, k_num_opts[k].alias))) return k;
    return -1;
}

static void run_set_num(loom_request *req, int k, double d) {
    switch (k) {
    case RN_MAX_TOKENS: req->max_tokens = (int32_t)d; break;
    case RN_TEMPERATURE: req->params.temperature = (float)d; break;
    case RN_TOP_P: req->params.top_p = (float)d; break;
    case RN_TOP_K: req->params.top_k = (int32_t)d; break;
    case RN_MIN_P: req->params.min_p = (float)d; break;
    case RN_REPETITION: req->params.repetition_penalty = (float)d; break;
    case RN_PRESENCE: req->params.presence_penalty = (float)d; break;
    case RN_FREQUENCY: req->params.frequency_penalty = (float)d; break;
    case RN_SEED:
        req->params.seed = (uint64_t)d;
        req->params.has_seed = true;
        break;
    case RN_SAMPLES: req->n = (int32_t)d; break;
    }
}

/* What the command line asks for. */
typedef struct run_args {
    const char *config, *prompt, *prompt_file;
    cli_sets sets;
    const char **stops;   /* [argc + 1], NULL-terminated */
    int nstops;
    bool quiet, stream;
    loom_request req;     /* everything but the prompt and the callback */
} run_args;

/* The options that take the next word as their value. */
static bool run_takes_value(const char *a) {
    static const char *const valued[] = {"-p", "--prompt", "--prompt-file", "--system", "--stop", "--set", NULL};
    for (const char *const *v = valued; *v; v++)
        if (!strcmp(a, *v)) return true;
    return run_num_index(a) >= 0;
}

/* One word of the command line (argv[*i]; v is the next word or NULL): -1
 * to go on, else the exit code. */
static int run_option(run_args *r, int *i, const char *a, const char *v) {
    int k = run_num_index(a);
    double d;
    if (run_takes_value(a)) {
        if (!v) {
            fprintf(stderr, "loom run: %s needs a value (see loom run --help)\n", a);
            return LOOM_EXIT_FAIL;
        }
        (*i)++;
    }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        run_usage(stdout);
        return LOOM_EXIT_OK;
    } else if (k >= 0) {
        if (!parse_num(a, v, k_num_opts[k].lo, k_num_opts[k].hi, &d)) return LOOM_EXIT_FAIL;
        run_set_num(&r->req, k, d);
    } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
        r->prompt = v;
    } else if (!strcmp(a, "--prompt-file")) {
        r->prompt_file = v;
    } else if (!strcmp(a, "--chat")) {
        r->req.chat = true;
    } else if (!strcmp(a, "--system")) {
        r->req.system = v;
    } else if (!strcmp(a, "--stop")) {
        r->stops[r->nstops++] = v;
    } else if (!strcmp(a, "--ignore-eos")) {
        r->req.ignore_eos = true;
    } else if (!strcmp(a, "--stream")) {
        r->stream = true;
    } else if (!strcmp(a, "--set")) {
        cli_sets_add(&r->sets, v);
    } else if (!strncmp(a, "--set=", 6)) {
        cli_sets_add(&r->sets, a + 6);
    } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
        r->quiet = true;
    } else if (a[0] == '-' && a[1]) {
        fprintf(stderr, "loom run: unknown option '%s' (see loom run --help)\n", a);
        return LOOM_EXIT_USAGE;
    } else if (!r->config) {
        r->config = a;
    } else {
        fprintf(stderr, "loom run: unexpected argument '%s': quote the prompt and pass it with -p\n", a);
        return LOOM_EXIT_USAGE;
    }
    return -1;
}

/* The command line: -1 to go on, else the exit code. */
static int run_parse(run_args *r, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        int rc = run_option(r, &i, argv[i], i + 1 < argc ? argv[i + 1] : NULL);
        if (rc >= 0) return rc;
    }
    if (!r->config) {
        fprintf(stderr, "loom run: no pipeline file given\n\n");
        run_usage(stderr);
        return LOOM_EXIT_USAGE;
    }
    if (r->prompt && r->prompt_file) {
        fprintf(stderr, "loom run: give --prompt or --prompt-file, not both\n");
        return LOOM_EXIT_USAGE;
    }
    return -1;
}

/* The prompt from --prompt-file or, without -p, stdin: *buf (malloc'd).
 * false after a message (none when out of memory). */
static bool run_read_prompt(run_args *r, char **buf) {
    *buf = NULL;
    if (!r->prompt_file && r->prompt) return true;
    FILE *f = r->prompt_file ? fopen(r->prompt_file, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "loom run: cannot open prompt file '%s': %s\n", r->prompt_file, strerror(errno));
        return false;
    }
    if (!r->prompt_file) fprintf(stderr, "loom run: reading the prompt from stdin (use -p TEXT to give it inline)\n");
    *buf = read_all(f);
    if (r->prompt_file) fclose(f);
    r->prompt = *buf;
    return r->prompt != NULL;
}

/* Each sample's text (streamed single samples are already out). */
static void run_print_samples(const run_state *rs, int32_t n) {
    if (rs->stream && n == 1) {
        fputc('\n', stdout);
        return;
    }
    for (int32_t k = 0; k < n; k++) {
        if (n > 1) printf("--- sample %d ---\n", k);
        if (rs->text[k]) fwrite(rs->text[k], 1, rs->len[k], stdout);
        fputc('\n', stdout);
    }
}

/* "[model] finish: ... | prompt N tokens | prefill X tok/s | decode ..." */
static void run_print_stats(loom_engine *eng, const run_state *rs, int32_t n) {
    loom_engine_stats st;
    loom_engine_get_stats(eng, &st, sizeof st);
    double pf = st.prefill_seconds, dc = st.decode_seconds;
    int64_t dec_tokens = st.generated_tokens - n; /* first tokens come from prefill steps */
    fprintf(stderr, "\n[%s] finish: %s | prompt %lld tokens",
            loom_engine_model_name(eng), finish_name(rs->finish[0]), (long long)st.prompt_tokens);
    if (st.cached_prompt_tokens) fprintf(stderr, " (%lld cached)", (long long)st.cached_prompt_tokens);
    fprintf(stderr, " | prefill %.1f tok/s | decode %lld tokens, %.1f tok/s\n",
            pf > 0 ? (double)st.prefill_tokens / pf : 0.0, (long long)st.generated_tokens,
            dc > 0 && dec_tokens > 0 ? (double)dec_tokens / dc : 0.0);
}

static void run_state_free(run_state *rs) {
    if (rs->text)
        for (int32_t k = 0; k < rs->samples; k++) free(rs->text[k]);
    free(rs->text);
    free(rs->len);
    free(rs->finish);
}

/* Build the engine, generate, print; the exit code. */
static int run_generate(run_args *r) {
    int rc = LOOM_EXIT_FAIL;
    loom_request req = r->req;
    run_state rs = {.stream = r->stream};
    loom_error err = {0};
    loom_engine *eng = cli_engine_open("run", NULL, r->config, &r->sets, NULL);
    if (!eng) return LOOM_EXIT_FAIL;
    rs.samples = req.n;
    rs.text = calloc((size_t)req.n, sizeof(char *));
    rs.len = calloc((size_t)req.n, sizeof(size_t));
    rs.finish = calloc((size_t)req.n, sizeof(loom_finish_reason));
    if (!rs.text || !rs.len || !rs.finish) goto free_all;
    req.prompt = r->prompt;
    req.stop = r->nstops ? r->stops : NULL;
    req.on_token = on_token;
    req.user = &rs;
    if (loom_engine_add_request(eng, &req, &err) < 0) {
        fprintf(stderr, "loom run: %s\n", err.message);
        goto free_all;
    }
    if (loom_engine_run(eng, &err) != LOOM_OK) {
        fprintf(stderr, "\nloom run: %s\n", err.message);
        goto free_all;
    }
    run_print_samples(&rs, req.n);
    if (rs.error[0]) {
        fprintf(stderr, "loom run: %s\n", rs.error);
        goto free_all;
    }
    if (!r->quiet) run_print_stats(eng, &rs, req.n);
    rc = LOOM_EXIT_OK;
free_all:
    run_state_free(&rs);
    loom_engine_destroy(eng);
    return rc;
}

int loom_cmd_run(int argc, char **argv) {
    run_args r = {.req = loom_request_default()};
    char *prompt_buf = NULL;
    int rc = LOOM_EXIT_FAIL;
    r.req.max_tokens = 128;
    r.stops = calloc((size_t)argc + 1, sizeof *r.stops);
    if (!cli_sets_init(&r.sets, argc) || !r.stops) goto free_args;
    rc = run_parse(&r, argc, argv);
    if (rc >= 0) goto free_args;
    rc = LOOM_EXIT_FAIL;
    if (!run_read_prompt(&r, &prompt_buf)) goto free_args;
    rc = run_generate(&r);
free_args:
    free(prompt_buf);
    cli_sets_free(&r.sets);
    free(r.stops);
    return rc;
}
