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
    if (!ev->text || !*ev->text) return;
    if (rs->stream && rs->samples == 1) {
        fputs(ev->text, stdout);
        fflush(stdout);
        return;
    }
    size_t n = strlen(ev->text);
    int32_t k = ev->sample_index;
    char *t = realloc(rs->text[k], rs->len[k] + n + 1);
    if (!t) return;
    memcpy(t + rs->len[k], ev->text, n + 1);
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

int loom_cmd_run(int argc, char **argv) {
    const char *config = NULL, *prompt = NULL, *prompt_file = NULL;
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    const char **stops = calloc((size_t)argc + 1, sizeof *stops);
    int nsets = 0, nstops = 0, rc = 1;
    bool quiet = false;
    char *prompt_buf = NULL;
    loom_engine *eng = NULL;
    run_state rs = {0};
    loom_request req = loom_request_default();
    req.max_tokens = 128;
    if (!sets || !stops) goto out;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
#define NEED_VALUE()                                                                 \
    do {                                                                             \
        if (!v) {                                                                    \
            fprintf(stderr, "loom run: %s needs a value (see loom run --help)\n", a); \
            goto out;                                                                \
        }                                                                            \
        i++;                                                                         \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            rc = 0;
            goto out;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            NEED_VALUE();
            prompt = v;
        } else if (!strcmp(a, "--prompt-file")) {
            NEED_VALUE();
            prompt_file = v;
        } else if (!strcmp(a, "--chat")) {
            req.chat = true;
        } else if (!strcmp(a, "--system")) {
            NEED_VALUE();
            req.system = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
            NEED_VALUE();
            if (!parse_num(a, v, 1, 1e9, &d)) goto out;
            req.max_tokens = (int32_t)d;
        } else if (!strcmp(a, "--temperature")) {
            NEED_VALUE();
            if (!parse_num(a, v, 0, 100, &d)) goto out;
            req.params.temperature = (float)d;
        } else if (!strcmp(a, "--top-p")) {
            NEED_VALUE();
            if (!parse_num(a, v, 1e-9, 1, &d)) goto out;
            req.params.top_p = (float)d;
        } else if (!strcmp(a, "--top-k")) {
            NEED_VALUE();
            if (!parse_num(a, v, 0, 1e9, &d)) goto out;
            req.params.top_k = (int32_t)d;
        } else if (!strcmp(a, "--min-p")) {
            NEED_VALUE();
            if (!parse_num(a, v, 0, 1, &d)) goto out;
            req.params.min_p = (float)d;
        } else if (!strcmp(a, "--repetition-penalty")) {
            NEED_VALUE();
            if (!parse_num(a, v, 1e-3, 100, &d)) goto out;
            req.params.repetition_penalty = (float)d;
        } else if (!strcmp(a, "--presence-penalty")) {
            NEED_VALUE();
            if (!parse_num(a, v, -10, 10, &d)) goto out;
            req.params.presence_penalty = (float)d;
        } else if (!strcmp(a, "--frequency-penalty")) {
            NEED_VALUE();
            if (!parse_num(a, v, -10, 10, &d)) goto out;
            req.params.frequency_penalty = (float)d;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE();
            if (!parse_num(a, v, 0, 1.8e19, &d)) goto out;
            req.params.seed = (uint64_t)d;
            req.params.has_seed = true;
        } else if (!strcmp(a, "--samples")) {
            NEED_VALUE();
            if (!parse_num(a, v, 1, 64, &d)) goto out;
            req.n = (int32_t)d;
        } else if (!strcmp(a, "--stop")) {
            NEED_VALUE();
            stops[nstops++] = v;
        } else if (!strcmp(a, "--ignore-eos")) {
            req.ignore_eos = true;
        } else if (!strcmp(a, "--stream")) {
            rs.stream = true;
        } else if (!strcmp(a, "--set")) {
            NEED_VALUE();
            sets[nsets++] = v;
        } else if (!strncmp(a, "--set=", 6)) {
            sets[nsets++] = a + 6;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "loom run: unknown option '%s' (see loom run --help)\n", a);
            rc = 2;
            goto out;
        } else if (!config) {
            config = a;
        } else {
            fprintf(stderr, "loom run: unexpected argument '%s': quote the prompt and pass it with -p\n", a);
            rc = 2;
            goto out;
        }
#undef NEED_VALUE
    }
    if (!config) {
        fprintf(stderr, "loom run: no pipeline file given\n\n");
        run_usage(stderr);
        rc = 2;
        goto out;
    }
    if (prompt && prompt_file) {
        fprintf(stderr, "loom run: give --prompt or --prompt-file, not both\n");
        rc = 2;
        goto out;
    }
    if (prompt_file || !prompt) {
        FILE *f = prompt_file ? fopen(prompt_file, "rb") : stdin;
        if (!f) {
            fprintf(stderr, "loom run: cannot open prompt file '%s': %s\n", prompt_file, strerror(errno));
            goto out;
        }
        if (!prompt_file) fprintf(stderr, "loom run: reading the prompt from stdin (use -p TEXT to give it inline)\n");
        prompt_buf = read_all(f);
        if (prompt_file) fclose(f);
        prompt = prompt_buf;
        if (!prompt) goto out;
    }

    loom_error err = {0};
    if (loom_engine_create(config, sets, nsets, &eng, &err) != LOOM_OK) {
        fprintf(stderr, "loom run: %s\n", err.message);
        goto out;
    }
    rs.samples = req.n;
    rs.text = calloc((size_t)req.n, sizeof(char *));
    rs.len = calloc((size_t)req.n, sizeof(size_t));
    rs.finish = calloc((size_t)req.n, sizeof(loom_finish_reason));
    if (!rs.text || !rs.len || !rs.finish) goto out;
    req.prompt = prompt;
    req.stop = nstops ? stops : NULL;
    req.on_token = on_token;
    req.user = &rs;
    if (loom_engine_add_request(eng, &req, &err) < 0) {
        fprintf(stderr, "loom run: %s\n", err.message);
        goto out;
    }
    if (loom_engine_run(eng, &err) != LOOM_OK) {
        fprintf(stderr, "\nloom run: %s\n", err.message);
        goto out;
    }
    if (rs.stream && req.n == 1) {
        fputc('\n', stdout);
    } else {
        for (int32_t k = 0; k < req.n; k++) {
            if (req.n > 1) printf("--- sample %d ---\n", k);
            printf("%s\n", rs.text[k] ? rs.text[k] : "");
        }
    }
    if (rs.error[0]) {
        fprintf(stderr, "loom run: %s\n", rs.error);
        goto out;
    }
    if (!quiet) {
        loom_engine_stats st;
        loom_engine_get_stats(eng, &st);
        double pf = st.prefill_seconds, dc = st.decode_seconds;
        int64_t dec_tokens = st.generated_tokens - req.n; /* first tokens come from prefill steps */
        fprintf(stderr, "\n[%s] finish: %s | prompt %lld tokens",
                loom_engine_model_name(eng), finish_name(rs.finish[0]), (long long)st.prompt_tokens);
        if (st.cached_prompt_tokens) fprintf(stderr, " (%lld cached)", (long long)st.cached_prompt_tokens);
        fprintf(stderr, " | prefill %.1f tok/s | decode %lld tokens, %.1f tok/s\n",
                pf > 0 ? (double)st.prefill_tokens / pf : 0.0, (long long)st.generated_tokens,
                dc > 0 && dec_tokens > 0 ? (double)dec_tokens / dc : 0.0);
    }
    rc = 0;
out:
    if (rs.text)
        for (int32_t k = 0; k < rs.samples; k++) free(rs.text[k]);
    free(rs.text);
    free(rs.len);
    free(rs.finish);
    loom_engine_destroy(eng);
    free(prompt_buf);
    free(sets);
    free(stops);
    return rc;
}
