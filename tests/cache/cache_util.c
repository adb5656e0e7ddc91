/*
 * tests/cache/cache_util.c — see cache_util.h.
 */
#include "cache_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_host.h"

bool tc_apply_defaults(const loom_param *params, void *cfg, size_t cfg_size) {
    memset(cfg, 0, cfg_size);
    for (const loom_param *p = params; p->key; p++) {
        char *end = NULL;
        const char *d = p->default_value;
        if (!d) continue;
        switch (p->type) {
        case LOOM_PARAM_BOOL: {
            if (p->offset + sizeof(bool) > cfg_size) goto bad;
            bool v = !strcmp(d, "true");
            if (!v && strcmp(d, "false")) goto bad;
            memcpy((char *)cfg + p->offset, &v, sizeof v);
            break;
        }
        case LOOM_PARAM_INT: {
            if (p->offset + sizeof(int64_t) > cfg_size) goto bad;
            int64_t v = strtoll(d, &end, 10);
            if (*end || (p->min <= p->max && (v < p->min || v > p->max))) goto bad;
            memcpy((char *)cfg + p->offset, &v, sizeof v);
            break;
        }
        case LOOM_PARAM_FLOAT: {
            if (p->offset + sizeof(double) > cfg_size) goto bad;
            double v = strtod(d, &end);
            if (*end || (p->min <= p->max && (v < p->min || v > p->max))) goto bad;
            memcpy((char *)cfg + p->offset, &v, sizeof v);
            break;
        }
        case LOOM_PARAM_ENUM: { /* the index of the default among the choices */
            if (p->offset + sizeof(int64_t) > cfg_size || !p->choices) goto bad;
            int64_t v = 0;
            while (p->choices[v] && strcmp(p->choices[v], d)) v++;
            if (!p->choices[v]) goto bad;
            memcpy((char *)cfg + p->offset, &v, sizeof v);
            break;
        }
        default:
            goto bad;
        }
        continue;
    bad:
        fprintf(stderr, "param %s: default '%s' does not fit\n", p->key, d);
        return false;
    }
    return true;
}

static size_t tc_block_bytes(void *ctx, int32_t block_size) {
    (void)ctx;
    return (size_t)block_size * TC_BYTES_PER_TOKEN;
}

loom_cache_init tc_init_desc(size_t free_bytes, int32_t max_model_len, bool can_swap) {
    return (loom_cache_init){
        .struct_size = sizeof(loom_cache_init),
        .block_bytes = tc_block_bytes,
        .ctx = NULL,
        .device_free_bytes = free_bytes,
        .device_total_bytes = free_bytes * 2,
        .max_model_len = max_model_len,
        .backend_can_swap = can_swap,
    };
}

loom_status tc_open(tc_cache *c, const loom_cache_ops *ops, const void *cfg,
                    const loom_cache_init *init, loom_error *err) {
    memset(c, 0, sizeof *c);
    c->ops = ops;
    c->layout.struct_size = sizeof c->layout;
    c->layout.dtype = LOOM_DTYPE_F16;
    loom_status st = ops->create(fake_host(), cfg, &c->self, err);
    if (st != LOOM_OK) return st;
    st = ops->init(c->self, init, &c->layout, err);
    if (st != LOOM_OK) {
        ops->destroy(c->self);
        c->self = NULL;
    }
    return st;
}

void tc_close(tc_cache *c) {
    if (c->self) c->ops->destroy(c->self);
    c->self = NULL;
}

loom_seq_info tc_seq(loom_seq_id id, const int32_t *tokens, int32_t num_tokens,
                     int32_t num_draft) {
    return (loom_seq_info){
        .struct_size = sizeof(loom_seq_info),
        .id = id,
        .request_id = id,
        .num_prompt_tokens = num_tokens,
        .num_tokens = num_tokens,
        .max_total_tokens = num_tokens + 64,
        .tokens = tokens,
        .num_draft = num_draft,
    };
}

int32_t tc_table(const tc_cache *c, loom_seq_id id, int32_t *out) {
    return c->ops->block_table(c->self, id, out, 1024);
}

int32_t tc_take_ops(const tc_cache *c, loom_block_op *out) {
    int32_t n = 0, k;
    while (n < 4096 && (k = c->ops->take_block_ops(c->self, out + n, 4096 - n)) > 0) n += k;
    return n;
}
