/*
 * cli/cmd_bench.c — `loom bench`: offline serving benchmark, and A/B
 * comparison of two pipelines on one workload.
 *
 * A workload is N requests (prompt tokens, output length, arrival time),
 * read from a JSONL file or generated from length distributions with an
 * optional shared prefix and Poisson arrivals. Requests enter the engine
 * when their arrival time has passed on the wall clock; every request
 * generates exactly its output length (ignore_eos), so two pipelines do the
 * same work. Reported: throughput, TTFT and TPOT percentiles, peak KV use
 * (share of the pool, MiB, and the most one sequence held), preemptions and
 * prefix-cache hits; --json writes them for scripts.
 * --concurrency runs the workload closed-loop (a request enters only
 * while fewer than C are in flight), once per level on the same engine, so
 * one load (minutes for a model quantized at load) gives the batch-1 to
 * batch-256 rows of a table.
 * --constraint holds every request to a decoding constraint (structured
 * outputs): the request then ends where the constraint lets it or at its
 * output length, so a schema longer than the output keeps the work equal.
 * Uses only the public engine API.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "engine_setup.h"
#include "loom/engine.h"

static void bench_usage(FILE *f) {
    fputs("Usage: loom bench CONFIG [options]\n"
          "       loom bench --compare A.yaml B.yaml [options]\n"
          "\n"
          "Offline benchmark: run a workload through the engine and report throughput,\n"
          "TTFT/TPOT percentiles, peak KV-cache use (share, MiB, per sequence), preemptions\n"
          "and prefix hits.\n"
          "\n"
          "Workload (a file, or a generator):\n"
          "  --workload FILE        JSONL, one request per line:\n"
          "                         {\"prompt\": \"text\" | \"prompt_tokens\": [ids], \"output_len\": N,\n"
          "                          \"chat\": true = the prompt is one user turn (optional)}\n"
          "  --num-requests N       generated requests (default 64); with --concurrency N,N,...\n"
          "                         gives each level its own count\n"
          "  --input-len A[:B]      prompt tokens, uniform in [A, B] (default 128)\n"
          "  --output-len A[:B]     output tokens, uniform in [A, B] (default 64)\n"
          "  --shared-prefix-ratio R  fraction of requests starting with one shared prefix (default 0)\n"
          "  --prefix-len N         length of that shared prefix in tokens (default 64)\n"
          "  --rate R               Poisson arrivals, requests/s (default: all at once)\n"
          "  --concurrency C[,C...] closed loop: a request enters only while fewer than C are in\n"
          "                         flight (and, with --rate, once it has arrived), its TTFT counted\n"
          "                         from then, as vLLM's --max-concurrency; with several levels\n"
          "                         (ascending, at most 8) each level runs its own requests (the\n"
          "                         next ones of the workload; a --workload file needs a count per\n"
          "                         level) on the same engine, one table each (peaks are since the\n"
          "                         engine opened)\n"
          "  --seed S               workload seed (default 0)\n"
          "  --constraint LANG      hold every request to a decoding constraint of the pipeline's\n"
          "                         constraint plugin (json_object, json_schema, regex, gbnf)\n"
          "  --constraint-text T    its text, or @FILE (a schema, regex or grammar)\n"
          "\n"
          "Run:\n"
          "  --compare A B          run both pipelines on the same workload, interleaved,\n"
          "                         and print each metric side by side with the ratio B/A\n"
          "  --repeat N             runs per pipeline, interleaved (default 1; medians reported)\n"
          "  --warmup N             N untimed requests (random ids, 16 new tokens) through each\n"
          "                         engine first: GPU graph captures and GEMM plans (default 0;\n"
          "                         with --concurrency before each level, at least C of them)\n"
          "  --set KEY=VALUE        override a pipeline key (applies to both in --compare)\n"
          "  --json FILE            also write the results as JSON ('-' = stdout)\n"
          "  --no-progress          no progress bar\n"
          "  -h, --help             this help\n",
          f);
}

typedef struct bench_req {
    int32_t *tokens;
    int32_t num_tokens;
    char *prompt;        /* text prompt from a workload file, else NULL */
    bool chat;           /* wrap the prompt in the model's chat template */
    int32_t output_len;
    double arrival;      /* seconds after start */
    const char *constraint_lang, *constraint; /* --constraint, or NULL */
} bench_req;

#define BENCH_MAX_LEVELS 8
#define BENCH_MAX_REQUESTS (1 << 24) /* generated requests, over every level */

typedef struct bench_track {
    double start_wall;
    double *first;       /* (n) time of first token, -1 = none yet */
    double *last;        /* (n) time of the last token              */
    double *sent;        /* (n) time the request was added          */
    int32_t *count;      /* (n) tokens generated                    */
    int32_t *index_of;   /* engine request id - id_base -> workload index */
    int64_t id_base;     /* id of the first workload request (after warm-up) */
    int32_t first_index; /* the first request's index in the whole workload (messages) */
    int64_t index_cap;
    int32_t finished;
    int64_t tokens;
    int32_t errors;
    char error[256];
    double *ttft, *tpot; /* (n) scratch for the percentiles */
} bench_track;

typedef struct bench_result {
    double seconds, req_per_s, out_tok_per_s, total_tok_per_s;
    double ttft[3], tpot[3]; /* p50 p90 p99, seconds */
    double peak_kv, prefix_hit_rate;
    double peak_kv_mib, seq_kv_mib; /* peak KV bytes; most one sequence held */
    int64_t preemptions, prefill_tokens, cached_tokens, output_tokens;
    int64_t swaps_out, swaps_in, spec_proposed, spec_accepted, device_sampled;
    int32_t max_running, errors;
    int32_t kv_groups, peak_seq_blocks, peak_blocks;
    int64_t steps;
    double step_seconds, backend_seconds; /* inside engine steps; inside the backend's forward */
    loom_engine_stats kinds;              /* the kind_* split of those (loom_step_kind) */
} bench_result;

/* What the command line asks for. */
typedef struct bench_args {
    const char *config, *cmp_a, *cmp_b;  /* CONFIG, or --compare A B                 */
    const char *workload, *json_path;    /* --workload FILE, --json FILE ('-': stdout) */
    cli_sets sets;
    int repeat, warmup;
    int32_t nreq, in_a, in_b, out_a, out_b, prefix_len;
    double shared, rate;
    uint64_t seed;
    bool progress;
    const char *constraint_lang;         /* --constraint                               */
    char *constraint;                    /* --constraint-text, read (owned)            */
    int32_t levels[BENCH_MAX_LEVELS];    /* --concurrency, ascending                   */
    int nlev;                            /* 0: the open loop                           */
    int32_t level_nreq[BENCH_MAX_LEVELS]; /* --num-requests N,N...: each level's count */
    int n_level_nreq;                    /* 0: one count (nreq) for every level        */
} bench_args;

/* splitmix64: the workload generator's own deterministic stream. */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s) { return (double)(mix(s) >> 11) * (1.0 / 9007199254740992.0); }

static bool parse_range(const char *opt, const char *v, int32_t *a, int32_t *b) {
    char *end;
    long x = strtol(v, &end, 10), y = x;
    if (*end == ':') y = strtol(end + 1, &end, 10);
    if (*end || x < 1 || y < x || y > 10000000) {
        fprintf(stderr, "loom bench: %s expects N or A:B with 1 <= A <= B, got '%s'\n", opt, v);
        return false;
    }
    *a = (int32_t)x;
    *b = (int32_t)y;
    return true;
}

static void on_token(void *user, const loom_token_event *ev) {
    bench_track *t = user;
    const int64_t k = ev->request_id - t->id_base;
    if (k < 0 || k >= t->index_cap) return;
    int32_t i = t->index_of[k];
    double now = cli_now() - t->start_wall;
    if (ev->token >= 0) {
        if (t->first[i] < 0) t->first[i] = now;
        t->last[i] = now;
        t->count[i]++;
        t->tokens++;
    }
    if (ev->finish != LOOM_FINISH_NONE) {
        t->finished++;
        if (ev->finish == LOOM_FINISH_ERROR) {
            t->errors++;
            if (ev->error) snprintf(t->error, sizeof t->error, "%s", ev->error);
        }
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void percentiles(double *v, int32_t n, double out[3]) {
    if (n == 0) {
        out[0] = out[1] = out[2] = NAN;
        return;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    const double q[3] = {0.50, 0.90, 0.99};
    for (int k = 0; k < 3; k++) {
        double pos = q[k] * (n - 1);
        int32_t lo = (int32_t)pos;
        int32_t hi = lo + 1 < n ? lo + 1 : lo;
        out[k] = v[lo] + (v[hi] - v[lo]) * (pos - lo);
    }
}

/* Untimed warm-up: `count` requests of random token ids (so they share no
 * prefix with the workload), as long as the workload's average token prompt
 * (64 for text prompts), 16 new tokens each, all at once or at most `limit`
 * in flight (0: no limit) — on a GPU the first steps of each batch shape
 * pay CUDA-graph captures and GEMM plan searches that the timed run should
 * not. `salt` varies the ids (a level's warm-up must not find the last
 * level's in the prefix cache). *base gets the engine's counters afterwards,
 * for run_level to subtract. */
static int warm_up(loom_engine *eng, const bench_req *w, int32_t n, int32_t count, int32_t limit, uint64_t salt,
                   loom_engine_stats *base) {
    loom_error err = {0};
    int64_t sum = 0, cnt = 0;
    for (int32_t i = 0; i < n; i++)
        if (w[i].num_tokens > 0) sum += w[i].num_tokens, cnt++;
    int32_t len = cnt ? (int32_t)(sum / cnt) : 64, vocab = loom_engine_vocab_size(eng);
    int32_t ctx = loom_engine_max_context(eng);
    if (len > ctx - 17) len = ctx - 17;
    if (len < 1 || vocab < 4) return 0;
    int32_t *ids = malloc((size_t)len * sizeof *ids);
    if (!ids) return 1;
    uint64_t x = 0x9e3779b97f4a7c15ULL ^ (salt * 0xbf58476d1ce4e5b9ULL);
    int32_t sent = 0, active = 0;
    while (sent < count || active > 0) {
        for (; sent < count && (limit <= 0 || active < limit); sent++, active++) {
            for (int32_t i = 0; i < len; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                ids[i] = 3 + (int32_t)(x % (uint64_t)(vocab - 3));
            }
            loom_request rq = loom_request_default();
            rq.tokens = ids, rq.num_tokens = len, rq.max_tokens = 16, rq.ignore_eos = true;
            if (loom_engine_add_request(eng, &rq, &err) < 0) {
                fprintf(stderr, "loom bench: warm-up request: %s\n", err.message);
                free(ids);
                return 1;
            }
        }
        if (loom_engine_step(eng, &active, &err) != LOOM_OK) {
            fprintf(stderr, "loom bench: warm-up: %s\n", err.message);
            free(ids);
            return 1;
        }
    }
    free(ids); /* the engine copied each prompt */
    loom_engine_get_stats(eng, base, sizeof *base);
    return 0;
}

static bool track_init(bench_track *t, int32_t n) {
    *t = (bench_track){.index_cap = n};
    t->first = malloc((size_t)n * sizeof(double));
    t->last = calloc((size_t)n, sizeof(double));
    t->sent = calloc((size_t)n, sizeof(double));
    t->count = calloc((size_t)n, sizeof(int32_t));
    t->index_of = calloc((size_t)n, sizeof(int32_t));
    t->ttft = malloc((size_t)n * sizeof(double));
    t->tpot = malloc((size_t)n * sizeof(double));
    if (!t->first || !t->last || !t->sent || !t->count || !t->index_of || !t->ttft || !t->tpot) return false;
    for (int32_t i = 0; i < n; i++) t->first[i] = -1;
    return true;
}

static void track_free(bench_track *t) {
    free(t->first);
    free(t->last);
    free(t->sent);
    free(t->count);
    free(t->index_of);
    free(t->ttft);
    free(t->tpot);
}

/* Add every request whose arrival time has passed (now, seconds since the
 * start) while fewer than `limit` are in flight (0: no limit); *next is the
 * first not yet added. false after a message. */
static bool submit_arrived(loom_engine *eng, const bench_req *w, int32_t n, double now, int32_t limit,
                           int32_t *next, bench_track *t) {
    loom_error err = {0};
    for (; *next < n && w[*next].arrival <= now && (limit <= 0 || *next - t->finished < limit); (*next)++) {
        const bench_req *q = &w[*next];
        loom_request rq = loom_request_default();
        if (q->prompt) {
            rq.prompt = q->prompt;
            rq.chat = q->chat;
        } else {
            rq.tokens = q->tokens;
            rq.num_tokens = q->num_tokens;
        }
        rq.max_tokens = q->output_len;
        rq.ignore_eos = q->constraint_lang == NULL; /* a constrained text ends where its constraint says */
        rq.constraint_lang = q->constraint_lang;
        rq.constraint = q->constraint;
        rq.on_token = on_token;
        rq.user = t;
        int64_t id = loom_engine_add_request(eng, &rq, &err);
        if (id < 0) {
            fprintf(stderr, "loom bench: request %d: %s\n", t->first_index + *next, err.message);
            return false;
        }
        if (*next == 0) t->id_base = id;
        id -= t->id_base;
        if (id < 0 || id >= t->index_cap) { /* an engine's ids are dense: nothing else adds requests */
            fprintf(stderr, "loom bench: unexpected request id %lld\n", (long long)id);
            return false;
        }
        t->index_of[id] = *next;
        t->sent[*next] = now;
    }
    return true;
}

/* Step the engine until every request has arrived and finished, adding
 * requests on the wall clock (at most `limit` in flight, 0: any) and
 * sleeping while none is due. *seconds: the whole run. false after a
 * message. */
static bool drive(loom_engine *eng, const char *label, const bench_req *w, int32_t n, int32_t limit,
                  bool progress, bench_track *t, double *seconds) {
    loom_error err = {0};
    bool tty = isatty(2);
    t->start_wall = cli_now();
    int32_t next = 0, active = 0;
    double last_print = 0;
    while (next < n || active > 0) {
        if (!submit_arrived(eng, w, n, cli_now() - t->start_wall, limit, &next, t)) return false;
        if (loom_engine_step(eng, &active, &err) != LOOM_OK) {
            fprintf(stderr, "\nloom bench: %s: %s\n", label, err.message);
            return false;
        }
        if (active == 0 && next < n) {
            double wait = w[next].arrival - (cli_now() - t->start_wall);
            if (wait > 0) usleep((useconds_t)(wait * 1e6));
        }
        double now = cli_now() - t->start_wall;
        if (progress && (now - last_print > (tty ? 0.2 : 5.0) || (next == n && active == 0))) {
            fprintf(stderr, "%s[%s] %d/%d requests done, %lld tokens, %.1f s%s", tty ? "\r" : "", label,
                    t->finished, n, (long long)t->tokens, now, tty ? "   " : "\n");
            last_print = now;
        }
    }
    if (progress && tty) fputc('\n', stderr);
    *seconds = cli_now() - t->start_wall;
    return true;
}

/* Counters from the warm-up do not belong to the run (peaks stay). */
static void stats_minus(loom_engine_stats *st, const loom_engine_stats *base) {
    st->prompt_tokens -= base->prompt_tokens, st->prefill_tokens -= base->prefill_tokens;
    st->cached_prompt_tokens -= base->cached_prompt_tokens, st->preemptions -= base->preemptions;
    st->prefix_queries -= base->prefix_queries, st->prefix_hits -= base->prefix_hits;
    st->swaps_out -= base->swaps_out, st->swaps_in -= base->swaps_in;
    st->spec_proposed -= base->spec_proposed, st->spec_accepted -= base->spec_accepted;
    st->device_sampled_rows -= base->device_sampled_rows;
    st->steps -= base->steps;
    st->prefill_seconds -= base->prefill_seconds, st->decode_seconds -= base->decode_seconds;
    st->backend_seconds -= base->backend_seconds;
    st->constraint_mask_seconds -= base->constraint_mask_seconds, st->constraint_masks -= base->constraint_masks;
    st->constraint_accept_seconds -= base->constraint_accept_seconds;
    for (int k = 0; k < LOOM_STEP_KINDS; k++) {
        st->kind_steps[k] -= base->kind_steps[k], st->kind_tokens[k] -= base->kind_tokens[k];
        st->kind_seconds[k] -= base->kind_seconds[k], st->kind_backend_seconds[k] -= base->kind_backend_seconds[k];
    }
}

/* The run's metrics from the engine's counters and the per-request timing;
 * closed (a --concurrency level): TTFT from the moment a request was added,
 * not from its arrival, which only the open loop honours. */
static void fill_result(bench_result *res, const loom_engine_stats *st, bench_track *t, const bench_req *w,
                        int32_t n, double total, bool closed) {
    int32_t nt = 0, np = 0;
    int64_t out_tokens = 0, in_tokens = 0;
    for (int32_t i = 0; i < n; i++) {
        out_tokens += t->count[i];
        in_tokens += w[i].num_tokens;
        if (t->first[i] >= 0) t->ttft[nt++] = t->first[i] - (closed ? t->sent[i] : w[i].arrival);
        if (t->count[i] > 1) t->tpot[np++] = (t->last[i] - t->first[i]) / (t->count[i] - 1);
    }
    memset(res, 0, sizeof *res);
    res->seconds = total;
    res->req_per_s = n / total;
    res->out_tok_per_s = (double)out_tokens / total;
    res->total_tok_per_s = (double)(out_tokens + st->prompt_tokens) / total;
    percentiles(t->ttft, nt, res->ttft);
    percentiles(t->tpot, np, res->tpot);
    res->peak_kv = st->kv_blocks_total ? (double)st->kv_blocks_peak / st->kv_blocks_total : 0;
    res->peak_kv_mib = (double)st->kv_blocks_peak * (double)st->kv_block_bytes / (1 << 20);
    res->seq_kv_mib = (double)st->kv_peak_seq_blocks * (double)st->kv_block_bytes / (1 << 20);
    res->kv_groups = st->kv_groups;
    res->peak_seq_blocks = st->kv_peak_seq_blocks;
    res->peak_blocks = st->kv_blocks_peak;
    /* prompt tokens served from the prefix cache, per request once: the
     * cache's own query counter also counts every admission the scheduler
     * retried (a request waiting for blocks is looked up again each step) */
    res->prefix_hit_rate = st->prompt_tokens ? (double)st->cached_prompt_tokens / (double)st->prompt_tokens : 0;
    res->preemptions = st->preemptions;
    res->prefill_tokens = st->prefill_tokens;
    res->cached_tokens = st->cached_prompt_tokens;
    res->output_tokens = out_tokens;
    res->max_running = st->max_running;
    res->swaps_out = st->swaps_out;
    res->swaps_in = st->swaps_in;
    res->spec_proposed = st->spec_proposed;
    res->spec_accepted = st->spec_accepted;
    res->device_sampled = st->device_sampled_rows;
    res->steps = st->steps;
    res->step_seconds = st->prefill_seconds + st->decode_seconds;
    res->backend_seconds = st->backend_seconds;
    res->kinds = *st;
    res->errors = t->errors;
}

/* Level k's requests, w[*off .. *off + count): each level its own (no
 * prompt of one level is in the prefix cache for the next) — its
 * --num-requests count after the earlier levels', or a generated
 * workload's k-th slice of nreq; the open loop, and a workload file at a
 * single level, run all n (bench_parse refuses a file at several levels
 * without counts). Returns the count. */
static int32_t bench_level_slice(const bench_args *b, int k, int32_t n, int32_t *off) {
    *off = 0;
    if (b->n_level_nreq) {
        for (int j = 0; j < k; j++) *off += b->level_nreq[j];
        return b->level_nreq[k];
    }
    if (b->nlev && !b->workload) {
        *off = k * b->nreq;
        return b->nreq;
    }
    return n;
}

static int32_t bench_level_count(const bench_args *b, int k, int32_t n) {
    int32_t off;
    return bench_level_slice(b, k, n, &off);
}

/* Requests over every level: where the last level's slice ends (n: a
 * workload file's size, or nreq for a generated one). */
static int64_t bench_levels_total(const bench_args *b, int32_t n) {
    int32_t off, last = bench_level_slice(b, b->nlev ? b->nlev - 1 : 0, n, &off);
    return (int64_t)off + last;
}

/* The workload once through `eng` at level k's concurrency `limit` (0: the
 * open loop), w the level's n requests (w[0] the workload's `first`), after
 * `warmup` untimed requests (at least `limit` of them); the engine's
 * counters before the level are subtracted. 0, or 1 after a message. */
static int run_level(loom_engine *eng, const char *label, int warmup, int k, int32_t limit, bench_req *w,
                     int32_t n, int32_t first, bool progress, bench_result *res) {
    bench_track t = {0};
    double total;
    loom_engine_stats base;
    loom_engine_get_stats(eng, &base, sizeof base);
    int rc = 1;
    if (warmup > 0 && warm_up(eng, w, n, warmup > limit ? warmup : limit, limit, (uint64_t)k, &base))
        goto free_track;
    if (!track_init(&t, n)) goto free_track;
    t.first_index = first;
    if (!drive(eng, label, w, n, limit, progress, &t, &total)) goto free_track;
    loom_engine_stats st;
    loom_engine_get_stats(eng, &st, sizeof st);
    stats_minus(&st, &base);
    fill_result(res, &st, &t, w, n, total, limit > 0);
    if (t.errors) fprintf(stderr, "loom bench: %d requests failed, e.g.: %s\n", t.errors, t.error);
    rc = t.errors ? 1 : 0;
free_track:
    track_free(&t);
    return rc;
}

/* Run the workload through one fresh engine built from `config`, once per
 * concurrency level (b->levels; none: once, the open loop) into
 * res[0..max(nlev, 1)), level k over its slice (bench_level_slice). */
static int run_once(const bench_args *b, const char *label, const char *config, bench_req *w, int32_t n,
                    bench_result *res) {
    loom_engine *eng = cli_engine_open("bench", config, config, &b->sets, NULL);
    if (!eng) return 1;
    int rc = 0;
    for (int k = 0; k < (b->nlev ? b->nlev : 1) && !rc; k++) {
        char tag[64];
        if (b->nlev) snprintf(tag, sizeof tag, "%s @%d", label, b->levels[k]);
        else snprintf(tag, sizeof tag, "%s", label);
        int32_t off, cnt = bench_level_slice(b, k, n, &off);
        bench_req *lw = w + off;
        if (b->nlev) { /* a level's arrivals count from its first request's, as the open loop's from 0 */
            if (!(lw = malloc((size_t)cnt * sizeof *lw))) {
                rc = 1;
                break;
            }
            for (int32_t i = 0; i < cnt; i++) lw[i] = w[off + i], lw[i].arrival -= w[off].arrival;
        }
        rc = run_level(eng, tag, b->warmup, k, b->nlev ? b->levels[k] : 0, lw, cnt, off, b->progress, &res[k]);
        if (lw != w + off) free(lw); /* a shallow copy: the prompts are w's */
    }
    loom_engine_destroy(eng);
    return rc;
}

/* ------------------------------------------------------------- workload */

static void free_workload(bench_req *w, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        free(w[i].tokens);
        free(w[i].prompt);
    }
    free(w);
}

/* One request from line `lineno` of the workload file: a text prompt or
 * token ids, and an output length. false after a message; *r may then hold
 * a token array (freed with the workload). */
static bool parse_request(const cJSON *j, const char *path, int32_t lineno, bench_req *r) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "prompt_tokens");
    const cJSON *ol = cJSON_GetObjectItemCaseSensitive(j, "output_len");
    r->chat = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "chat"));
    if (cJSON_IsString(p)) {
        r->prompt = strdup(p->valuestring);
    } else if (cJSON_IsArray(pt) && cJSON_GetArraySize(pt) > 0) {
        r->num_tokens = cJSON_GetArraySize(pt);
        r->tokens = malloc((size_t)r->num_tokens * sizeof(int32_t));
        int32_t k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, pt) {
            if (!cJSON_IsNumber(e)) {
                fprintf(stderr, "%s:%d: prompt_tokens must hold integers\n", path, lineno);
                return false;
            }
            r->tokens[k++] = (int32_t)e->valuedouble;
        }
    } else {
        fprintf(stderr, "%s:%d: needs \"prompt\" (string) or \"prompt_tokens\" (array)\n", path, lineno);
        return false;
    }
    if (!cJSON_IsNumber(ol) || ol->valuedouble < 1) {
        fprintf(stderr, "%s:%d: needs \"output_len\" >= 1\n", path, lineno);
        return false;
    }
    r->output_len = (int32_t)ol->valuedouble;
    return true;
}

/* The requests of a JSONL workload file, one object a line (blank lines
 * skipped), all arriving at once. */
static int load_workload(const char *path, bench_req **out, int32_t *n) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "loom bench: cannot open workload '%s': %s\n", path, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int32_t count = 0, alloc = 0, lineno = 0;
    bench_req *w = NULL;
    int rc = 1;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len <= 1) continue;
        cJSON *j = cJSON_Parse(line);
        if (!j || !cJSON_IsObject(j)) {
            fprintf(stderr, "%s:%d: not a JSON object (expected {\"prompt\": ..., \"output_len\": N})\n", path,
                    lineno);
            cJSON_Delete(j);
            goto close_file;
        }
        if (count == alloc) {
            alloc = alloc ? alloc * 2 : 64;
            bench_req *nw = realloc(w, (size_t)alloc * sizeof *w);
            if (!nw) {
                cJSON_Delete(j);
                goto close_file;
            }
            w = nw;
        }
        memset(&w[count], 0, sizeof *w);
        bool ok = parse_request(j, path, lineno, &w[count]);
        count++; /* a half-read request is freed with the rest */
        cJSON_Delete(j);
        if (!ok) goto close_file;
    }
    if (count == 0) {
        fprintf(stderr, "loom bench: workload '%s' has no requests\n", path);
        goto close_file;
    }
    rc = 0;
close_file:
    free(line);
    fclose(f);
    if (rc) {
        free_workload(w, count);
        w = NULL;
        count = 0;
    }
    *out = w;
    *n = count;
    return rc;
}

/* Random prompt tokens drawn from [100, vocab_hint): avoids the special
 * tokens most vocabularies keep at the start. */
static bench_req *gen_workload(int32_t n, int32_t in_a, int32_t in_b, int32_t out_a, int32_t out_b,
                               double shared_ratio, int32_t prefix_len, double rate, uint64_t seed,
                               int32_t vocab_hint) {
    bench_req *w = calloc((size_t)n, sizeof *w);
    if (!w) return NULL;
    uint64_t s = seed * 0x2545F4914F6CDD1DULL + 1;
    int32_t span = vocab_hint > 200 ? vocab_hint - 100 : 100;
    int32_t *prefix = malloc((size_t)prefix_len * sizeof(int32_t));
    if (!prefix) {
        free(w);
        return NULL;
    }
    for (int32_t k = 0; k < prefix_len; k++) prefix[k] = 100 + (int32_t)(mix(&s) % (uint64_t)span);
    double t = 0;
    for (int32_t i = 0; i < n; i++) {
        bench_req *r = &w[i];
        r->num_tokens = in_a + (int32_t)(mix(&s) % (uint64_t)(in_b - in_a + 1));
        r->output_len = out_a + (int32_t)(mix(&s) % (uint64_t)(out_b - out_a + 1));
        r->tokens = malloc((size_t)r->num_tokens * sizeof(int32_t));
        bool shared = unif(&s) < shared_ratio;
        for (int32_t k = 0; k < r->num_tokens; k++)
            r->tokens[k] = shared && k < prefix_len ? prefix[k] : 100 + (int32_t)(mix(&s) % (uint64_t)span);
        if (rate > 0) t += -log(1.0 - unif(&s)) / rate;
        r->arrival = t;
    }
    free(prefix);
    return w;
}

/* ------------------------------------------------------------- reporting */

typedef struct metric {
    const char *name;
    const char *unit;
    size_t offset;
    bool higher_better;
} metric;

#define M(field) offsetof(bench_result, field)
static const metric metrics[] = {
    {"throughput", "req/s", M(req_per_s), true},
    {"output tokens/s", "tok/s", M(out_tok_per_s), true},
    {"total tokens/s", "tok/s", M(total_tok_per_s), true},
    {"TTFT p50", "ms", M(ttft[0]), false},
    {"TTFT p90", "ms", M(ttft[1]), false},
    {"TTFT p99", "ms", M(ttft[2]), false},
    {"TPOT p50", "ms", M(tpot[0]), false},
    {"TPOT p90", "ms", M(tpot[1]), false},
    {"TPOT p99", "ms", M(tpot[2]), false},
    {"peak KV use", "%", M(peak_kv), false},
    {"peak KV", "MiB", M(peak_kv_mib), false},
    {"KV per sequence, peak", "MiB", M(seq_kv_mib), false},
    {"prefix hit rate", "%", M(prefix_hit_rate), true},
    {"wall time", "s", M(seconds), false},
};
#undef M

static double metric_value(const bench_result *r, const metric *m) {
    double v = *(const double *)((const char *)r + m->offset);
    if (!strcmp(m->unit, "ms")) v *= 1e3;
    if (!strcmp(m->unit, "%")) v *= 100;
    return v;
}

static const char *const step_kind_names[LOOM_STEP_KINDS] = {"prefill", "mixed", "decode"};

static void print_counts(FILE *f, const char *label, const bench_result *r) {
    fprintf(f, "%-18s prefill %lld tokens computed, %lld served from prefix cache, %lld output tokens, "
           "%lld preemptions, %d sequences at most in one step\n",
           label, (long long)r->prefill_tokens, (long long)r->cached_tokens, (long long)r->output_tokens,
           (long long)r->preemptions, r->max_running);
    fprintf(f, "%-18s KV: peak %d blocks (%.1f MiB), one sequence at most %d blocks (%.2f MiB) in %d block table%s\n",
            "", r->peak_blocks, r->peak_kv_mib, r->peak_seq_blocks, r->seq_kv_mib, r->kv_groups,
            r->kv_groups == 1 ? "" : "s");
    if (r->swaps_out || r->swaps_in)
        fprintf(f, "%-18s %lld blocks swapped out, %lld in\n", "", (long long)r->swaps_out, (long long)r->swaps_in);
    if (r->steps > 0)
        fprintf(f, "%-18s %lld steps, %.3f s in them: backend forward %.3f s (%.1f %%), engine's own work %.3f ms a step\n",
                "", (long long)r->steps, r->step_seconds, r->backend_seconds,
                r->step_seconds > 0 ? 100.0 * r->backend_seconds / r->step_seconds : 0.0,
                1e3 * (r->step_seconds - r->backend_seconds) / (double)r->steps);
    for (int k = 0; k < LOOM_STEP_KINDS; k++)
        if (r->kinds.kind_steps[k] > 0)
            fprintf(f, "%-18s %-8s %6lld steps, %9lld tokens, %8.3f s (%5.1f %% of the wall), %.3f ms a step, "
                       "backend %.1f %%\n",
                    "", step_kind_names[k], (long long)r->kinds.kind_steps[k], (long long)r->kinds.kind_tokens[k],
                    r->kinds.kind_seconds[k], r->seconds > 0 ? 100.0 * r->kinds.kind_seconds[k] / r->seconds : 0.0,
                    1e3 * r->kinds.kind_seconds[k] / (double)r->kinds.kind_steps[k],
                    r->kinds.kind_seconds[k] > 0 ? 100.0 * r->kinds.kind_backend_seconds[k] / r->kinds.kind_seconds[k]
                                                 : 0.0);
    if (r->seconds > r->step_seconds && r->steps > 0)
        fprintf(f, "%-18s outside the steps %.3f s (%.1f %% of the wall)\n", "", r->seconds - r->step_seconds,
                100.0 * (r->seconds - r->step_seconds) / r->seconds);
    if (r->kinds.constraint_masks && r->steps > 0)
        fprintf(f, "%-18s constraint: %lld masks, %.3f ms a step computing them (inside the backend's forward, "
                   "beside the GPU), %.3f ms a step advancing the matchers\n",
                "", (long long)r->kinds.constraint_masks, 1e3 * r->kinds.constraint_mask_seconds / (double)r->steps,
                1e3 * r->kinds.constraint_accept_seconds / (double)r->steps);
    if (r->spec_proposed)
        fprintf(f, "%-18s speculation: %lld draft tokens proposed, %lld accepted (%.1f %%)\n", "",
                (long long)r->spec_proposed, (long long)r->spec_accepted,
                100.0 * (double)r->spec_accepted / (double)r->spec_proposed);
}

static cJSON *result_json(const bench_result *r) {
    cJSON *o = cJSON_CreateObject();
    for (size_t k = 0; k < sizeof metrics / sizeof metrics[0]; k++) {
        char key[64];
        snprintf(key, sizeof key, "%s_%s", metrics[k].name, metrics[k].unit);
        for (char *c = key; *c; c++)
            if (*c == ' ' || *c == '/') *c = '_';
        cJSON_AddNumberToObject(o, key, metric_value(r, &metrics[k]));
    }
    cJSON_AddNumberToObject(o, "preemptions", (double)r->preemptions);
    cJSON_AddNumberToObject(o, "prefill_tokens", (double)r->prefill_tokens);
    cJSON_AddNumberToObject(o, "cached_prompt_tokens", (double)r->cached_tokens);
    cJSON_AddNumberToObject(o, "output_tokens", (double)r->output_tokens);
    cJSON_AddNumberToObject(o, "max_running", r->max_running);
    cJSON_AddNumberToObject(o, "kv_groups", r->kv_groups);
    cJSON_AddNumberToObject(o, "kv_peak_blocks", r->peak_blocks);
    cJSON_AddNumberToObject(o, "kv_peak_seq_blocks", r->peak_seq_blocks);
    cJSON_AddNumberToObject(o, "swaps_out", (double)r->swaps_out);
    cJSON_AddNumberToObject(o, "swaps_in", (double)r->swaps_in);
    cJSON_AddNumberToObject(o, "spec_proposed", (double)r->spec_proposed);
    cJSON_AddNumberToObject(o, "spec_accepted", (double)r->spec_accepted);
    cJSON_AddNumberToObject(o, "device_sampled_rows", (double)r->device_sampled);
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    cJSON_AddNumberToObject(o, "step_seconds", r->step_seconds);
    cJSON_AddNumberToObject(o, "backend_seconds", r->backend_seconds);
    cJSON *kinds = cJSON_AddObjectToObject(o, "steps_by_kind");
    for (int k = 0; k < LOOM_STEP_KINDS && kinds; k++) {
        cJSON *x = cJSON_AddObjectToObject(kinds, step_kind_names[k]);
        if (!x) break;
        cJSON_AddNumberToObject(x, "steps", (double)r->kinds.kind_steps[k]);
        cJSON_AddNumberToObject(x, "tokens", (double)r->kinds.kind_tokens[k]);
        cJSON_AddNumberToObject(x, "seconds", r->kinds.kind_seconds[k]);
        cJSON_AddNumberToObject(x, "backend_seconds", r->kinds.kind_backend_seconds[k]);
    }
    if (r->kinds.constraint_masks) {
        cJSON_AddNumberToObject(o, "constraint_masks", (double)r->kinds.constraint_masks);
        cJSON_AddNumberToObject(o, "constraint_mask_seconds", r->kinds.constraint_mask_seconds);
        cJSON_AddNumberToObject(o, "constraint_accept_seconds", r->kinds.constraint_accept_seconds);
    }
    cJSON_AddNumberToObject(o, "errors", r->errors);
    return o;
}

/* Median over repeats, metric by metric. */
static void median_result(bench_result *runs, int n, bench_result *out) {
    *out = runs[n / 2];
    double *v = malloc((size_t)n * sizeof(double));
    if (!v) return;
    size_t nd = offsetof(bench_result, preemptions) / sizeof(double);
    for (size_t k = 0; k < nd; k++) {
        for (int i = 0; i < n; i++) v[i] = ((double *)&runs[i])[k];
        qsort(v, (size_t)n, sizeof *v, cmp_d);
        ((double *)out)[k] = v[n / 2];
    }
    free(v);
}


/* A comma list of up to BENCH_MAX_LEVELS integers in [1, hi], ascending
 * where `ascending` (--concurrency, --num-requests). false after a message
 * naming `opt`. */
static bool parse_list(const char *opt, const char *v, long hi, bool ascending, int32_t *out, int *count) {
    const char *p = v;
    *count = 0;
    for (;;) {
        char *end;
        errno = 0;
        long c = strtol(p, &end, 10);
        if (end == p || errno || c < 1 || c > hi || (*end && *end != ',') || *count == BENCH_MAX_LEVELS ||
            (ascending && *count && c <= out[*count - 1])) {
            fprintf(stderr, "loom bench: %s expects up to %d%s numbers in 1..%ld separated by commas, got '%s'\n",
                    opt, BENCH_MAX_LEVELS, ascending ? " ascending" : "", hi, v);
            return false;
        }
        out[(*count)++] = (int32_t)c;
        if (!*end) return true;
        p = end + 1;
    }
}

/* An integer option's value (as an int, the way it is stored) in [lo, hi];
 * false after "loom bench: OPT expects WHAT, got 'V'". */
static bool bench_int(const char *opt, const char *v, int lo, int hi, const char *what, int *out) {
    char *end;
    *out = (int)strtol(v, &end, 10);
    if (*end || *out < lo || *out > hi) {
        fprintf(stderr, "loom bench: %s expects %s, got '%s'\n", opt, what, v);
        return false;
    }
    return true;
}

/* --constraint-text's value: the text, or @FILE's contents (at most
 * 16 MiB); NULL after a message. */
static char *constraint_text(const char *v) {
    if (v[0] != '@') return strdup(v);
    FILE *f = fopen(v + 1, "rb");
    char *buf = NULL;
    long len = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && len <= (16L << 20) &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, f) == (size_t)len)
        buf[len] = '\0';
    else if (buf)
        free(buf), buf = NULL;
    if (!buf)
        fprintf(stderr, "loom bench: --constraint-text %s: %s\n", v,
                !f ? strerror(errno) : len > (16L << 20) ? "larger than 16 MiB" : "cannot read it");
    if (f) fclose(f);
    return buf;
}

/* An option that takes the next word (v, not NULL): -1 to go on, else the
 * exit code. */
static int bench_valued(bench_args *b, const char *a, const char *v) {
    char *end = NULL;
    int l;
    if (!strcmp(a, "--workload")) {
        b->workload = v;
    } else if (!strcmp(a, "--num-requests")) {
        if (!parse_list(a, v, BENCH_MAX_REQUESTS, false, b->level_nreq, &b->n_level_nreq)) return LOOM_EXIT_USAGE;
        b->nreq = b->level_nreq[0];
        if (b->n_level_nreq == 1) b->n_level_nreq = 0;
    } else if (!strcmp(a, "--input-len")) {
        if (!parse_range(a, v, &b->in_a, &b->in_b)) return LOOM_EXIT_USAGE;
    } else if (!strcmp(a, "--output-len")) {
        if (!parse_range(a, v, &b->out_a, &b->out_b)) return LOOM_EXIT_USAGE;
    } else if (!strcmp(a, "--shared-prefix-ratio")) {
        b->shared = strtod(v, &end);
        if (*end || b->shared < 0 || b->shared > 1) {
            fprintf(stderr, "loom bench: --shared-prefix-ratio expects a number in [0, 1], got '%s'\n", v);
            return LOOM_EXIT_USAGE;
        }
    } else if (!strcmp(a, "--prefix-len")) {
        if (!bench_int(a, v, 1, INT_MAX, "a positive integer", &l)) return LOOM_EXIT_USAGE;
        b->prefix_len = (int32_t)l;
    } else if (!strcmp(a, "--rate")) {
        b->rate = !strcmp(v, "inf") ? 0 : strtod(v, &end);
        if ((end && *end) || b->rate < 0) {
            fprintf(stderr, "loom bench: --rate expects requests/s (> 0) or 'inf', got '%s'\n", v);
            return LOOM_EXIT_USAGE;
        }
    } else if (!strcmp(a, "--seed")) {
        b->seed = strtoull(v, &end, 10);
    } else if (!strcmp(a, "--warmup")) {
        if (!bench_int(a, v, 0, 4096, "0..4096 requests", &b->warmup)) return LOOM_EXIT_USAGE;
    } else if (!strcmp(a, "--repeat")) {
        if (!bench_int(a, v, 1, 100, "1..100", &b->repeat)) return LOOM_EXIT_USAGE;
    } else if (!strcmp(a, "--set")) {
        cli_sets_add(&b->sets, v);
    } else if (!strcmp(a, "--concurrency")) {
        if (!parse_list(a, v, 65536, true, b->levels, &b->nlev)) return LOOM_EXIT_USAGE;
    } else if (!strcmp(a, "--constraint")) {
        b->constraint_lang = v;
    } else if (!strcmp(a, "--constraint-text")) {
        free(b->constraint);
        if (!(b->constraint = constraint_text(v))) return LOOM_EXIT_USAGE;
    } else {
        b->json_path = v; /* --json */
    }
    return -1;
}

/* The command line: -1 to go on, else the exit code. */
static int bench_parse(bench_args *b, int argc, char **argv) {
    static const char *const valued[] = {"--workload", "--num-requests", "--input-len", "--output-len",
                                         "--shared-prefix-ratio", "--prefix-len", "--rate", "--seed",
                                         "--warmup", "--repeat", "--set", "--json", "--constraint",
                                         "--constraint-text", "--concurrency", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = false;
        for (const char *const *k = valued; *k && !takes; k++) takes = !strcmp(a, *k);
        if (takes) {
            if (!v) {
                fprintf(stderr, "loom bench: %s needs a value (see loom bench --help)\n", a);
                return LOOM_EXIT_USAGE;
            }
            i++;
            int rc = bench_valued(b, a, v);
            if (rc >= 0) return rc;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage(stdout);
            return LOOM_EXIT_OK;
        } else if (!strcmp(a, "--compare")) {
            if (i + 2 >= argc) {
                fprintf(stderr, "loom bench: --compare needs two pipeline files\n");
                return LOOM_EXIT_USAGE;
            }
            b->cmp_a = argv[++i];
            b->cmp_b = argv[++i];
        } else if (!strcmp(a, "--no-progress")) {
            b->progress = false;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "loom bench: unknown option '%s' (see loom bench --help)\n", a);
            return LOOM_EXIT_USAGE;
        } else if (!b->config) {
            b->config = a;
        } else {
            fprintf(stderr, "loom bench: unexpected argument '%s'\n", a);
            return LOOM_EXIT_USAGE;
        }
    }
    if (!b->config && !b->cmp_a) {
        fprintf(stderr, "loom bench: give a pipeline file or --compare A B\n\n");
        bench_usage(stderr);
        return LOOM_EXIT_USAGE;
    }
    if (b->config && b->cmp_a) {
        fprintf(stderr, "loom bench: give either CONFIG or --compare A B, not both\n");
        return LOOM_EXIT_USAGE;
    }
    if (b->n_level_nreq && b->n_level_nreq != b->nlev) {
        fprintf(stderr, "loom bench: --num-requests gives %d counts, one per --concurrency level: %d level(s)\n",
                b->n_level_nreq, b->nlev);
        return LOOM_EXIT_USAGE;
    }
    if (b->workload && b->nlev > 1 && !b->n_level_nreq) {
        fprintf(stderr, "loom bench: --workload at %d --concurrency levels needs --num-requests N,N,...: each "
                        "level its own requests of the file (one level's prompts would sit in the prefix cache "
                        "for the next)\n", b->nlev);
        return LOOM_EXIT_USAGE;
    }
    const int64_t total = bench_levels_total(b, b->nreq);
    if (!b->workload && total > BENCH_MAX_REQUESTS) {
        fprintf(stderr, "loom bench: %lld requests over the levels: at most %d\n", (long long)total,
                BENCH_MAX_REQUESTS);
        return LOOM_EXIT_USAGE;
    }
    return -1;
}

/* The workload: the --workload file, or generated with token ids bounded by
 * the vocabulary of a short-lived engine. -1 to go on, else the exit code. */
static int make_workload(const bench_args *b, bench_req **w, int32_t *n) {
    if (b->workload) {
        if (load_workload(b->workload, w, n)) return LOOM_EXIT_FAIL;
        const int64_t total = bench_levels_total(b, *n);
        if (b->n_level_nreq && total > *n) {
            fprintf(stderr, "loom bench: --num-requests asks for %lld requests over its levels; %s holds %d\n",
                    (long long)total, b->workload, *n);
            return LOOM_EXIT_USAGE;
        }
        return -1;
    }
    loom_engine *probe = cli_engine_open("bench", NULL, b->config ? b->config : b->cmp_a, &b->sets, NULL);
    if (!probe) return LOOM_EXIT_FAIL;
    int32_t vocab = loom_engine_vocab_size(probe);
    int32_t ctx = loom_engine_max_context(probe);
    loom_engine_destroy(probe);
    if (b->in_b + b->out_b > ctx) {
        fprintf(stderr, "loom bench: input %d + output %d tokens exceed the context (%d)\n", b->in_b, b->out_b,
                ctx);
        return LOOM_EXIT_USAGE;
    }
    /* every level its own requests, one after the other (bench_parse bounded them) */
    const int32_t total = (int32_t)bench_levels_total(b, b->nreq);
    *w = gen_workload(total, b->in_a, b->in_b, b->out_a, b->out_b, b->shared, b->prefix_len, b->rate, b->seed,
                      vocab);
    if (!*w) return LOOM_EXIT_FAIL;
    *n = total;
    return -1;
}

/* The metrics table of one pipeline (B NULL), or of two side by side, at
 * one concurrency level (0: the open loop). */
static void print_table(FILE *tbl, const bench_args *b, int32_t n, int32_t level, const char *la, const char *lb,
                        const bench_result *A, const bench_result *B) {
    fprintf(tbl, "\nworkload: %d requests%s%s, %d run(s) each", n, b->workload ? " from " : " generated",
           b->workload ? b->workload : "", b->repeat);
    if (level > 0) fprintf(tbl, ", at most %d in flight", level);
    fputc('\n', tbl);
    if (!lb) {
        fprintf(tbl, "%-18s %14s\n", "metric", la);
        for (size_t k = 0; k < sizeof metrics / sizeof metrics[0]; k++)
            fprintf(tbl, "%-18s %14.3f %s\n", metrics[k].name, metric_value(A, &metrics[k]), metrics[k].unit);
        print_counts(tbl, "counts:", A);
        return;
    }
    fprintf(tbl, "%-18s %14s %14s %10s\n", "metric", "A", "B", "B/A");
    for (size_t k = 0; k < sizeof metrics / sizeof metrics[0]; k++) {
        double x = metric_value(A, &metrics[k]), y = metric_value(B, &metrics[k]);
        if (x != 0 && isfinite(x) && isfinite(y))
            fprintf(tbl, "%-18s %14.3f %14.3f %9.2fx  %s\n", metrics[k].name, x, y, y / x, metrics[k].unit);
        else
            fprintf(tbl, "%-18s %14.3f %14.3f %10s  %s\n", metrics[k].name, x, y, "-", metrics[k].unit);
    }
    fprintf(tbl, "A = %s\nB = %s\n", la, lb);
    print_counts(tbl, "A counts:", A);
    print_counts(tbl, "B counts:", B);
}

/* --json: the results as one document, to a file or stdout ('-'): A's
 * (and B's) results, or with --concurrency a "levels" list of them, one per
 * level (A[k], B[k]). */
static void write_json(const bench_args *b, int32_t n, const char *la, const char *lb, const bench_result *A,
                       const bench_result *B) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "num_requests", n);
    cJSON_AddNumberToObject(root, "repeat", b->repeat);
    cJSON_AddStringToObject(root, "a", la);
    if (lb) cJSON_AddStringToObject(root, "b", lb);
    cJSON *levels = b->nlev ? cJSON_AddArrayToObject(root, "levels") : NULL;
    for (int k = 0; k < (b->nlev ? b->nlev : 1); k++) {
        cJSON *o = root;
        if (levels) {
            o = cJSON_CreateObject();
            cJSON_AddItemToArray(levels, o);
            cJSON_AddNumberToObject(o, "concurrency", b->levels[k]);
            cJSON_AddNumberToObject(o, "num_requests", bench_level_count(b, k, n));
        }
        cJSON_AddItemToObject(o, "a_results", result_json(&A[k]));
        if (lb) cJSON_AddItemToObject(o, "b_results", result_json(&B[k]));
    }
    char *s = cJSON_Print(root);
    FILE *f = strcmp(b->json_path, "-") ? fopen(b->json_path, "w") : stdout;
    if (!f || !s) {
        fprintf(stderr, "loom bench: cannot write %s: %s\n", b->json_path, strerror(errno));
    } else {
        fprintf(f, "%s\n", s);
        if (f != stdout) fclose(f);
    }
    free(s);
    cJSON_Delete(root);
}

/* Run A (and B) `repeat` times, interleaved, each run every concurrency
 * level on one engine, and report the medians per level; the exit code. */
static int bench_runs(const bench_args *b, bench_req *w, int32_t n) {
    const char *la = b->config ? b->config : b->cmp_a, *lb = b->cmp_b;
    const int L = b->nlev ? b->nlev : 1, R = b->repeat;
    int rc = LOOM_EXIT_FAIL;
    /* runs[k * R + r]: level k of run r; then the medians, one per level */
    bench_result *ra = calloc((size_t)L * R, sizeof *ra), *rb = calloc((size_t)L * R, sizeof *rb);
    bench_result *one = calloc((size_t)L, sizeof *one);
    bench_result *A = calloc((size_t)L, sizeof *A), *B = calloc((size_t)L, sizeof *B);
    if (!ra || !rb || !one || !A || !B) goto free_results;
    for (int r = 0; r < R; r++)
        for (int side = 0; side < (lb ? 2 : 1); side++) {
            if (run_once(b, side ? "B" : "A", side ? lb : la, w, n, one)) goto free_results;
            for (int k = 0; k < L; k++) (side ? rb : ra)[k * R + r] = one[k];
        }
    /* With --json -, stdout carries only the JSON document. */
    FILE *tbl = b->json_path && !strcmp(b->json_path, "-") ? stderr : stdout;
    for (int k = 0; k < L; k++) {
        median_result(&ra[k * R], R, &A[k]);
        if (lb) median_result(&rb[k * R], R, &B[k]);
        print_table(tbl, b, bench_level_count(b, k, n), b->nlev ? b->levels[k] : 0, la, lb, &A[k], &B[k]);
    }
    if (b->json_path) write_json(b, n, la, lb, A, B);
    rc = LOOM_EXIT_OK;
free_results:
    free(ra);
    free(rb);
    free(one);
    free(A);
    free(B);
    return rc;
}

int loom_cmd_bench(int argc, char **argv) {
    bench_args b = {.repeat = 1, .nreq = 64, .in_a = 128, .in_b = 128, .out_a = 64, .out_b = 64,
                    .prefix_len = 64, .progress = true};
    bench_req *w = NULL;
    int32_t n = 0;
    if (!cli_sets_init(&b.sets, argc)) return LOOM_EXIT_FAIL;
    int rc = bench_parse(&b, argc, argv);
    if (rc < 0) rc = make_workload(&b, &w, &n);
    for (int32_t i = 0; rc < 0 && i < n; i++) w[i].constraint_lang = b.constraint_lang, w[i].constraint = b.constraint;
    if (rc < 0) rc = bench_runs(&b, w, n);
    free_workload(w, n);
    free(b.constraint);
    cli_sets_free(&b.sets);
    return rc;
}
