/*
 * tests/spec/rogue_sched.c — scheduler "rogue", a test plugin that breaks
 * loom/scheduler.h on purpose so the core's check of its output can be
 * tested (tests/spec/test_engine.c). It runs every live sequence's
 * uncomputed tokens each step (allocating them first), except:
 *
 *   mode short_verify  a sequence with drafts gets only its last token
 *                      ({num_tokens - 1, 1}): the entry ends at num_tokens
 *                      but covers 1 of its 1 + num_draft verification rows.
 *   mode overflow      a sequence past its prefill gets
 *                      {INT32_MAX - 1, 8}: num_computed + num_tokens
 *                      overflows int32.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/scheduler.h"

#define ROGUE_MAX 64

typedef struct rogue_config {
    int64_t mode;
} rogue_config;

static const char *const rogue_modes[] = {"short_verify", "overflow", NULL};

static const loom_param rogue_params[] = {
    {"mode", LOOM_PARAM_ENUM, offsetof(rogue_config, mode), "short_verify", 0, 0, rogue_modes,
     "which rule to break"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct rogue {
    const loom_host *h;
    int32_t mode;
    loom_seq_id ids[ROGUE_MAX];
    int32_t n;
} rogue;

static loom_status rogue_create(const loom_host *h, const void *config, void **self, loom_error *err) {
    rogue *r = h->calloc(h->ctx, 1, sizeof *r);
    if (!r) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "scheduler.rogue: out of memory");
    r->h = h;
    r->mode = (int32_t)((const rogue_config *)config)->mode;
    *self = r;
    return LOOM_OK;
}

static void rogue_destroy(void *self) {
    rogue *r = self;
    if (r) r->h->free(r->h->ctx, r);
}

static loom_status rogue_add(void *self, const loom_seq_info *seq, loom_error *err) {
    rogue *r = self;
    if (r->n == ROGUE_MAX) return r->h->error(r->h->ctx, err, LOOM_ERR_NO_SPACE, "scheduler.rogue: full");
    r->ids[r->n++] = seq->id;
    return LOOM_OK;
}

static void rogue_remove(void *self, loom_seq_id seq) {
    rogue *r = self;
    for (int32_t i = 0; i < r->n; i++)
        if (r->ids[i] == seq) {
            memmove(r->ids + i, r->ids + i + 1, (size_t)(r->n - i - 1) * sizeof r->ids[0]);
            r->n--;
            return;
        }
}

static loom_status rogue_schedule(void *self, const loom_sched_env *env, loom_sched_output *out, loom_error *err) {
    rogue *r = self;
    for (int32_t i = 0; i < r->n && out->num_scheduled < out->capacity; i++) {
        const loom_seq_info *v = env->get_seq(env->ctx, r->ids[i]);
        if (!v || v->num_computed >= v->num_tokens) continue;
        loom_status st = env->cache->allocate(env->cache_self, v, v->num_tokens, err);
        if (st == LOOM_ERR_NO_SPACE) continue;
        if (st != LOOM_OK) return st;
        loom_sched_entry en = {.seq = v->id, .num_computed = v->num_computed,
                               .num_tokens = v->num_tokens - v->num_computed};
        if (r->mode == 0 && v->num_draft > 0) en.num_computed = v->num_tokens - 1, en.num_tokens = 1;
        if (r->mode == 1 && v->num_computed > 0) en.num_computed = INT32_MAX - 1, en.num_tokens = 8;
        out->scheduled[out->num_scheduled++] = en;
    }
    return LOOM_OK;
}

static const loom_scheduler_ops rogue_ops = {.struct_size = sizeof rogue_ops, .create = rogue_create,
                                             .destroy = rogue_destroy, .add = rogue_add, .remove = rogue_remove,
                                             .schedule = rogue_schedule};

static const loom_component rogue_components[] = {{.struct_size = sizeof(loom_component),
                                                   .kind = LOOM_KIND_SCHEDULER,
                                                   .name = "rogue",
                                                   .summary = "breaks the scheduler contract on purpose (tests)",
                                                   .ops = &rogue_ops,
                                                   .params = rogue_params,
                                                   .config_size = sizeof(rogue_config)}};

static const loom_plugin_desc rogue_desc = {LOOM_PLUGIN_DESC_HEADER, .name = "rogue-scheduler", .version = "0.0.0",
                                            .num_components = 1, .components = rogue_components};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &rogue_desc; }
