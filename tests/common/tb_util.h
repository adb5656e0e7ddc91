/*
 * tests/common/tb_util.h — driving loom-backend-cpu.so from a test without
 * the engine: dlopen the built plugin (path in LOOM_CPU_BACKEND_SO, set by
 * meson), create an instance on the fake host, and run steps of a tiny
 * paged-KV scheduler (a block free list, per-sequence block tables, slot
 * mapping) so tests can say "prefill 13 tokens of s0, decode s1" and get the
 * logits rows back. Shared by the backend and tp tests and the benchmark.
 */
#ifndef LOOM_TEST_TB_UTIL_H
#define LOOM_TEST_TB_UTIL_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_host.h"
#include "loom/backend.h"
#include "loom/executor.h"
#include "loom/plugin.h"

/* Same layout as the plugin's config struct (its `params` offsets say so;
 * tb_config_check verifies them). */
typedef struct tb_config {
    int64_t threads;
    int64_t kv_dtype;     /* 0 f32, 1 f16 */
    int64_t weight_dtype; /* 0 f32, 1 gguf (blocks as stored) */
    int64_t cpu_isa;      /* 0 auto, 1 avx512vnni, 2 avx512, 3 avx2, 4 portable */
    int64_t moe_dispatch; /* 0 all_reduce, 1 all_to_all (sharded MoE) */
} tb_config;

#define TB_MAX_SEQ_BLOCKS 512

typedef struct tb_seq {
    const int32_t *tokens; /* the whole sequence (prompt + what will be decoded) */
    int32_t len;           /* tokens available                                   */
    int32_t done;          /* tokens whose K/V is in the cache                   */
    int32_t blocks[TB_MAX_SEQ_BLOCKS];
    int32_t nblocks;
} tb_seq;

typedef struct tb {
    void *lib;
    const loom_plugin_desc *desc;
    const loom_component *comp;
    const loom_backend_ops *ops;
    void *self;
    int32_t block_size, num_blocks;
    int32_t *free_list; /* block ids, popped from the end */
    int32_t n_free;
} tb;

/* dlopen the plugin and find its "cpu" backend component; NULL + message on failure. */
static inline const loom_component *tb_load_plugin(tb *b, char *msg, size_t msg_size) {
    const char *path = getenv("LOOM_CPU_BACKEND_SO");
    if (!path) {
        snprintf(msg, msg_size, "LOOM_CPU_BACKEND_SO is not set (meson test sets it)");
        return NULL;
    }
    b->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!b->lib) {
        snprintf(msg, msg_size, "dlopen %s: %s", path, dlerror());
        return NULL;
    }
    loom_plugin_entry_fn entry = (loom_plugin_entry_fn)dlsym(b->lib, LOOM_PLUGIN_ENTRY_SYMBOL);
    if (!entry) {
        snprintf(msg, msg_size, "%s exports no %s", path, LOOM_PLUGIN_ENTRY_SYMBOL);
        return NULL;
    }
    b->desc = entry();
    for (uint32_t i = 0; b->desc && i < b->desc->num_components; i++)
        if (b->desc->components[i].kind == LOOM_KIND_BACKEND &&
            !strcmp(b->desc->components[i].name, "cpu"))
            b->comp = &b->desc->components[i];
    if (!b->comp) {
        snprintf(msg, msg_size, "%s has no backend component 'cpu'", path);
        return NULL;
    }
    b->ops = b->comp->ops;
    return b->comp;
}

/* Fill the block free list: ids 0..n-1, shuffled by `shuffle_seed` when non-zero. */
static inline bool tb_blocks_init(tb *b, int32_t block_size, int32_t num_blocks,
                                  uint64_t shuffle_seed) {
    b->block_size = block_size;
    b->num_blocks = num_blocks;
    b->free_list = malloc(sizeof(int32_t) * (size_t)num_blocks);
    if (!b->free_list) return false;
    /* popped from the end: store descending so the first pops are 0, 1, 2... */
    for (int32_t i = 0; i < num_blocks; i++) b->free_list[i] = num_blocks - 1 - i;
    b->n_free = num_blocks;
    uint64_t s = shuffle_seed;
    for (int32_t i = num_blocks - 1; shuffle_seed && i > 0; i--) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int32_t j = (int32_t)((s >> 33) % (uint64_t)(i + 1)), t = b->free_list[i];
        b->free_list[i] = b->free_list[j];
        b->free_list[j] = t;
    }
    return true;
}

/* An executor's model-runner methods as a backend ops table, so a test
 * drives the executor (self = its instance) as it drives one backend. */
static inline loom_backend_ops tb_executor_runner(const loom_executor_ops *x) {
    return (loom_backend_ops){.struct_size = sizeof(loom_backend_ops), .load = x->load,
                              .kv_block_bytes = x->kv_block_bytes, .memory = x->memory,
                              .kv_alloc = x->kv_alloc, .forward = x->forward,
                              .copy_blocks = x->copy_blocks, .forward_topk = x->forward_topk,
                              .swap_blocks = x->swap_blocks};
}

static inline void tb_close(tb *b) {
    if (b->self) b->ops->destroy(b->self);
    free(b->free_list);
    if (b->lib) dlclose(b->lib);
    memset(b, 0, sizeof *b);
}

/* Arrays of one step's batch (owned by the caller of tb_build, freed by tb_batch_free). */
typedef struct tb_batch {
    loom_batch batch;
    int32_t *tok, *pos, *qs, *ctx, *bt, *lidx;
    int64_t *slot;
} tb_batch;

static inline void tb_batch_free(tb_batch *tbb) {
    free(tbb->tok), free(tbb->pos), free(tbb->qs), free(tbb->ctx), free(tbb->bt);
    free(tbb->lidx), free(tbb->slot);
}

/* Build a step where seqs[i] gets nnew[i] new tokens (allocating blocks as
 * needed). Logits: every token when all_logits, else the last token of each
 * sequence. Returns false when out of blocks. Does not advance `done`. */
static inline bool tb_build(tb *b, tb_seq **seqs, const int32_t *nnew, int32_t nseq,
                            bool all_logits, tb_batch *out) {
    int32_t T = 0, stride = 1;
    for (int32_t i = 0; i < nseq; i++) {
        tb_seq *s = seqs[i];
        int32_t ctx = s->done + nnew[i];
        int32_t need = (ctx + b->block_size - 1) / b->block_size;
        while (s->nblocks < need) {
            if (b->n_free == 0 || s->nblocks == TB_MAX_SEQ_BLOCKS) return false;
            s->blocks[s->nblocks++] = b->free_list[--b->n_free];
        }
        if (s->nblocks > stride) stride = s->nblocks;
        T += nnew[i];
    }
    memset(out, 0, sizeof *out);
    out->tok = malloc(sizeof(int32_t) * (size_t)(T + 1));
    out->pos = malloc(sizeof(int32_t) * (size_t)(T + 1));
    out->lidx = malloc(sizeof(int32_t) * (size_t)(T + 1));
    out->slot = malloc(sizeof(int64_t) * (size_t)(T + 1));
    out->qs = malloc(sizeof(int32_t) * (size_t)(nseq + 1));
    out->ctx = malloc(sizeof(int32_t) * (size_t)(nseq + 1));
    out->bt = malloc(sizeof(int32_t) * (size_t)(nseq * stride + 1));
    int32_t t = 0, nl = 0;
    out->qs[0] = 0;
    for (int32_t i = 0; i < nseq; i++) {
        tb_seq *s = seqs[i];
        for (int32_t j = 0; j < stride; j++)
            out->bt[i * stride + j] = j < s->nblocks ? s->blocks[j] : -1;
        for (int32_t j = 0; j < nnew[i]; j++, t++) {
            int32_t p = s->done + j;
            out->tok[t] = s->tokens[p];
            out->pos[t] = p;
            out->slot[t] = (int64_t)s->blocks[p / b->block_size] * b->block_size +
                           p % b->block_size;
            if (all_logits || j == nnew[i] - 1) out->lidx[nl++] = t;
        }
        out->qs[i + 1] = t;
        out->ctx[i] = s->done + nnew[i];
    }
    out->batch = (loom_batch){.struct_size = sizeof(loom_batch),
                              .num_seqs = nseq,
                              .num_tokens = T,
                              .token_ids = out->tok,
                              .positions = out->pos,
                              .query_start = out->qs,
                              .context_len = out->ctx,
                              .block_table = out->bt,
                              .block_table_stride = stride,
                              .slot_mapping = out->slot,
                              .num_logits = nl,
                              .logits_index = out->lidx};
    return true;
}

/* Return a sequence's blocks to the free list. */
static inline void tb_seq_release(tb *b, tb_seq *s) {
    for (int32_t i = s->nblocks - 1; i >= 0; i--) b->free_list[b->n_free++] = s->blocks[i];
    s->nblocks = 0;
    s->done = 0;
}

#endif
