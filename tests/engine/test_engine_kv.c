/*
 * tests/engine/test_engine_kv.c — the engine's side of disaggregation
 * (loom/engine.h: on_kv_export, kv_remote, loom_engine_kv_deliver /
 * kv_fail), two engines in one process on random "tiny" dummy weights, no
 * connector in between: what the prefill engine exports, delivered to the
 * decode engine, must give the colocated engine's tokens and logprobs —
 * greedy and seeded sampling, several requests at once, prompts shorter
 * and longer than one block. A handoff that does not fit its request, a
 * failed transfer and an abort while the KV is on the way each end that
 * request alone, and every block is free afterwards on both engines.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "eng_util.h"

#define VOCAB 256
#define NREQ 4

/* What the prefill engine's on_kv_export gave for one request. */
typedef struct exported {
    eng_rec rec;               /* the prefill request's own events         */
    int32_t ntok;              /* tokens whose KV the blocks hold (prompt) */
    int32_t nb;                /* blocks read: all but the last token's    */
    size_t bb;
    int32_t bs;
    void *blocks;
    int calls;
} exported;

static loom_status on_export(void *user, const loom_kv_export *x) {
    exported *o = user;
    o->calls++;
    o->ntok = x->num_tokens;
    o->bs = x->block_size;
    o->bb = x->block_bytes;
    int32_t n = x->num_tokens - 1;
    o->nb = (n + x->block_size - 1) / x->block_size;
    o->blocks = malloc((size_t)o->nb * o->bb + 1);
    loom_error err = {0};
    loom_status st = x->read(x->ctx, 0, o->nb, o->blocks, (size_t)o->nb * o->bb, &err);
    cr_assert_eq(st, LOOM_OK, "export read: %s", err.message);
    /* a range outside the sequence is refused */
    cr_assert_neq(x->read(x->ctx, 0, x->num_blocks + 1, o->blocks, (size_t)(x->num_blocks + 1) * o->bb, &err), LOOM_OK);
    return LOOM_OK;
}

static void on_prefill_token(void *user, const loom_token_event *ev) { eng_on_token(&((exported *)user)->rec, ev); }

/* Prefill prompt p (n tokens) on engine P and return what it exported. */
static void prefill(loom_engine *P, const int32_t *p, int32_t n, exported *o) {
    memset(o, 0, sizeof *o);
    eng_rec_init(&o->rec, 1);
    loom_request r = eng_req_tokens(p, n, 1);
    r.on_token = on_prefill_token;
    r.on_kv_export = on_export;
    r.user = o;
    loom_error err = {0};
    cr_assert_geq(loom_engine_add_request(P, &r, &err), 0, "%s", err.message);
}

/* A 40-token prompt (into p) prefilled on P to the end: ex holds its KV. */
static void prefill_40(loom_engine *P, int32_t p[40], exported *ex) {
    eng_prompt(p, 40, 9u, VOCAB);
    prefill(P, p, 40, ex);
    eng_run(P, 2000);
    cr_assert_eq(ex->calls, 1);
}

static void expect_idle(loom_engine *e, const char *who) {
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_eq(st.kv_blocks_used, 0, "%s: %d KV blocks still held", who, st.kv_blocks_used);
    cr_assert_eq(st.kv_waiting, 0, "%s: %d requests still wait for KV", who, st.kv_waiting);
}

static loom_kv_handoff handoff_of(const exported *o, const int32_t *p) {
    return (loom_kv_handoff){.struct_size = sizeof(loom_kv_handoff), .num_tokens = o->ntok - 1, .tokens = p,
                             .block_size = o->bs, .num_blocks = o->nb, .block_bytes = o->bb, .blocks = o->blocks};
}

/* What a handoff read in place was told (loom_kv_handoff.done). */
typedef struct lent {
    int calls;
    loom_status st;
} lent;

static void on_done(void *ctx, loom_status st) {
    lent *l = ctx;
    l->calls++;
    l->st = st;
}

static loom_kv_handoff lend(loom_kv_handoff h, lent *l) {
    h.done = on_done;
    h.done_ctx = l;
    return h;
}

/* NREQ requests (prompt lengths around the block size, greedy and seeded)
 * colocated and disaggregated: the same tokens, logprobs within 1e-4 —
 * with the engine copying each handoff, or reading it in place. */
static void run_matches(bool seeded, bool in_place) {
    loom_engine *C = eng_open("tiny.yaml", NULL), *P = eng_open("tiny.yaml", NULL), *D = eng_open("tiny.yaml", NULL);
    loom_kv_info ip = {.struct_size = sizeof ip}, id = {.struct_size = sizeof id};
    loom_error err = {0};
    cr_assert_eq(loom_engine_kv_info(P, &ip, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(loom_engine_kv_info(D, &id, &err), LOOM_OK);
    cr_assert_eq(ip.block_bytes, id.block_bytes);
    cr_assert_eq(id.image_device, -1, "the cpu backend's images are host memory only");
    /* a caller built against ABI 2.4: its struct ends before image_device, nothing past it is written */
    struct {
        loom_kv_info k;
        unsigned char canary[16];
    } old;
    memset(&old, 0xA5, sizeof old);
    old.k.struct_size = offsetof(loom_kv_info, image_device);
    cr_assert_eq(loom_engine_kv_info(D, &old.k, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(old.k.struct_size, offsetof(loom_kv_info, image_device));
    cr_assert_eq(old.k.block_bytes, id.block_bytes);
    const unsigned char *tail = (const unsigned char *)&old.k + offsetof(loom_kv_info, image_device);
    for (size_t b = 0; b < sizeof old - offsetof(loom_kv_info, image_device); b++)
        cr_assert_eq(tail[b], 0xA5, "byte %zu past a 2.4 caller's loom_kv_info was written", b);
    old.k.struct_size = 8;
    cr_assert_eq(loom_engine_kv_info(D, &old.k, &err), LOOM_ERR_ABI);
    lent lt[NREQ] = {{0}};
    const int32_t lens[NREQ] = {2, 15, 17, 40};
    int32_t p[NREQ][64];
    eng_rec rc[NREQ], rd[NREQ];
    exported ex[NREQ];
    int64_t ids[NREQ];
    for (int i = 0; i < NREQ; i++) {
        eng_prompt(p[i], lens[i], 100u + (uint32_t)i, VOCAB);
        loom_request r = eng_req_tokens(p[i], lens[i], 12);
        r.params.logprobs = 2;
        if (seeded) r.params.temperature = 0.9f, r.params.has_seed = true, r.params.seed = 77u + (uint64_t)i;
        eng_rec_init(&rc[i], 1);
        eng_add(C, r, &rc[i]);
        eng_rec_init(&rd[i], 1);
        r.kv_remote = true;
        ids[i] = eng_add(D, r, &rd[i]);
        prefill(P, p[i], lens[i], &ex[i]);
    }
    eng_run(C, 2000);
    eng_run(P, 2000);
    eng_run(D, 50); /* nothing to step: every request waits for its KV */
    loom_engine_stats st;
    loom_engine_get_stats(D, &st, sizeof st);
    cr_assert_eq(st.kv_waiting, NREQ);
    cr_assert_eq(st.generated_tokens, 0);
    for (int i = NREQ - 1; i >= 0; i--) { /* delivered out of order */
        cr_assert_eq(ex[i].calls, 1);
        loom_kv_handoff h = handoff_of(&ex[i], p[i]);
        if (in_place) h = lend(h, &lt[i]);
        cr_assert_eq(loom_engine_kv_deliver(D, ids[i], &h, &err), LOOM_OK, "%s", err.message);
    }
    eng_run(D, 2000);
    for (int i = 0; i < NREQ && in_place; i++) /* written at the first step; never told twice */
        cr_assert(lt[i].calls == 1 && lt[i].st == LOOM_OK, "request %d: done %d times, status %d", i, lt[i].calls,
                  lt[i].st);
    for (int i = 0; i < NREQ; i++) {
        eng_rec_check_done(&rd[i]);
        const eng_sample *a = &rd[i].s[0], *b = &rc[i].s[0];
        cr_assert_eq(a->finish, LOOM_FINISH_LENGTH, "request %d: %s", i, a->error);
        cr_assert_eq(a->ntok, b->ntok);
        for (int32_t t = 0; t < a->ntok; t++) {
            cr_assert_eq(a->tokens[t], b->tokens[t], "request %d token %d", i, t);
            cr_assert(fabsf(a->lps[t] - b->lps[t]) < 1e-4f, "request %d token %d: logprob %g vs %g", i, t,
                      a->lps[t], b->lps[t]);
        }
        eng_rec_free(&rc[i]);
        eng_rec_free(&rd[i]);
        eng_rec_free(&ex[i].rec);
        free(ex[i].blocks);
    }
    loom_engine_get_stats(D, &st, sizeof st);
    cr_assert_gt(st.kv_imported_blocks, 0);
    /* the decode engine computed one prompt token per request: the rest came as KV */
    cr_assert_eq(st.prefill_tokens, NREQ, "the decode engine computed %lld prompt tokens", (long long)st.prefill_tokens);
    expect_idle(P, "prefill");
    expect_idle(D, "decode");
    loom_engine_destroy(C);
    loom_engine_destroy(P);
    loom_engine_destroy(D);
}

/* kv_info names the pools' element type with the backend's default
 * resolved (loom/backend.h kv_default_dtype): f16 and bf16 block images
 * have the same size, so a size alone would let a cpu engine (f16 by
 * default) and a cuda one (bf16) read each other's KV as their own. */
Test(engine_kv, info_names_the_pools_type) {
    const char *f16[] = {"backend.kv_dtype=f16", NULL}, *f32[] = {"backend.kv_dtype=f32", NULL};
    loom_engine *d = eng_open("tiny.yaml", NULL), *a = eng_open("tiny.yaml", f16), *b = eng_open("tiny.yaml", f32);
    loom_kv_info kd = {.struct_size = sizeof kd}, ka = kd, kb = kd;
    loom_error err = {0};
    cr_assert_eq(loom_engine_kv_info(d, &kd, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(loom_engine_kv_info(a, &ka, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(loom_engine_kv_info(b, &kb, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(kd.kv_dtype, LOOM_DTYPE_F16, "the cpu backend's default (f16) named, got %d", (int)kd.kv_dtype);
    cr_assert_eq(ka.kv_dtype, LOOM_DTYPE_F16);
    cr_assert_eq(kb.kv_dtype, LOOM_DTYPE_F32);
    cr_assert_eq(kb.block_bytes, 2 * ka.block_bytes);
    cr_assert_eq(kd.block_bytes, ka.block_bytes);
    loom_engine_destroy(d);
    loom_engine_destroy(a);
    loom_engine_destroy(b);
}

/* A backend built against ABI 2.7 (test backend "oldkv": the cpu backend
 * with its ops table cut before kv_default_dtype) loads and decodes the
 * cpu backend's tokens; loom_engine_kv_info refuses to hand its KV on,
 * naming why, unless the quantizer names the type (badkv's kv = F16). */
Test(engine_kv, backend_of_abi_2_7_runs_but_its_kv_stays) {
    const char *old[] = {"backend.plugin=oldkv", NULL}, *named[] = {"backend.plugin=oldkv", "quantizer.plugin=badkv",
                                                                     "quantizer.kv=1", NULL};
    loom_engine *o = eng_open("tiny.yaml", old), *c = eng_open("tiny.yaml", NULL), *n = eng_open("tiny.yaml", named);
    int32_t p[20];
    eng_prompt(p, 20, 3u, VOCAB);
    eng_rec ro, rc;
    eng_rec_init(&ro, 1), eng_rec_init(&rc, 1);
    eng_add(o, eng_req_tokens(p, 20, 8), &ro);
    eng_add(c, eng_req_tokens(p, 20, 8), &rc);
    eng_run(o, 200);
    eng_run(c, 200);
    eng_rec_check_done(&ro), eng_rec_check_done(&rc);
    cr_assert_eq(ro.s[0].ntok, 8);
    cr_assert_arr_eq(ro.s[0].tokens, rc.s[0].tokens, 8 * sizeof(int32_t), "the 2.7 backend decodes as the cpu backend");
    loom_kv_info k = {.struct_size = sizeof k};
    loom_error err = {0};
    cr_assert_eq(loom_engine_kv_info(o, &k, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "'oldkv'") && strstr(err.message, "kv_default_dtype"), "%s", err.message);
    cr_assert_eq(loom_engine_kv_info(n, &k, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(k.kv_dtype, LOOM_DTYPE_F16);
    eng_rec_free(&ro), eng_rec_free(&rc);
    loom_engine_destroy(o);
    loom_engine_destroy(c);
    loom_engine_destroy(n);
}

Test(engine_kv, greedy_handover_matches_colocated) { run_matches(false, false); }
Test(engine_kv, seeded_handover_matches_colocated) { run_matches(true, false); }
Test(engine_kv, in_place_handover_matches_colocated) { run_matches(false, true); }
Test(engine_kv, seeded_in_place_handover_matches_colocated) { run_matches(true, true); }

/* A handoff read in place finds no room while another request runs: it is
 * handed back (NO_SPACE) and the request still waits; a copy delivered
 * then waits for room and gives the colocated tokens. */
Test(engine_kv, in_place_without_room_is_handed_back) {
    const char *ov[] = {"engine.max_model_len=80", "cache.num_blocks=5", NULL};
    loom_engine *P = eng_open("tiny.yaml", ov), *D = eng_open("tiny.yaml", ov), *C = eng_open("tiny.yaml", ov);
    int32_t pa[50], pb[40];
    eng_prompt(pa, 50, 5u, VOCAB);
    eng_prompt(pb, 40, 6u, VOCAB);
    exported ex;
    prefill(P, pb, 40, &ex);
    eng_run(P, 2000);
    eng_rec ra, rb, rc;
    eng_rec_init(&ra, 1), eng_rec_init(&rb, 1), eng_rec_init(&rc, 1);
    eng_add(C, eng_req_tokens(pb, 40, 8), &rc);
    eng_run(C, 2000);
    eng_add(D, eng_req_tokens(pa, 50, 12), &ra); /* 4 of the 5 blocks while it runs */
    loom_request q = eng_req_tokens(pb, 40, 8);
    q.kv_remote = true;
    int64_t idb = eng_add(D, q, &rb);
    int32_t active = 0;
    loom_error err = {0};
    cr_assert_eq(loom_engine_step(D, &active, &err), LOOM_OK, "%s", err.message);
    lent l = {0};
    loom_kv_handoff h = lend(handoff_of(&ex, pb), &l);
    cr_assert_eq(loom_engine_kv_deliver(D, idb, &h, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(loom_engine_step(D, &active, &err), LOOM_OK, "%s", err.message);
    cr_assert(l.calls == 1 && l.st == LOOM_ERR_NO_SPACE, "done %d times, status %d", l.calls, l.st);
    loom_engine_stats st;
    loom_engine_get_stats(D, &st, sizeof st);
    cr_assert_eq(st.kv_waiting, 1, "the request still waits for its KV");
    h = handoff_of(&ex, pb); /* a copy: it waits for the first request's blocks */
    cr_assert_eq(loom_engine_kv_deliver(D, idb, &h, &err), LOOM_OK, "%s", err.message);
    eng_run(D, 2000);
    eng_rec_check_done(&ra);
    eng_rec_check_done(&rb);
    cr_assert_eq(rb.s[0].finish, LOOM_FINISH_LENGTH, "%s", rb.s[0].error);
    cr_assert_eq(rb.s[0].ntok, rc.s[0].ntok);
    for (int32_t t = 0; t < rb.s[0].ntok; t++) cr_assert_eq(rb.s[0].tokens[t], rc.s[0].tokens[t], "token %d", t);
    cr_assert_eq(l.calls, 1);
    expect_idle(D, "decode");
    eng_rec_free(&ra), eng_rec_free(&rb), eng_rec_free(&rc), eng_rec_free(&ex.rec);
    free(ex.blocks);
    loom_engine_destroy(P), loom_engine_destroy(D), loom_engine_destroy(C);
}

/* In-place handoffs: device memory a cpu engine cannot read, or without a
 * done callback, is refused at the call (done never called); one for a
 * request that no longer waits, or still queued when the engine is
 * destroyed, is dropped and told so exactly once. */
Test(engine_kv, in_place_refusals_and_drops) {
    loom_engine *P = eng_open("tiny.yaml", NULL), *D = eng_open("tiny.yaml", NULL);
    int32_t p[40];
    exported ex;
    prefill_40(P, p, &ex);
    eng_rec r[2];
    int64_t id[2];
    for (int i = 0; i < 2; i++) {
        eng_rec_init(&r[i], 1);
        loom_request q = eng_req_tokens(p, 40, 4);
        q.kv_remote = true;
        id[i] = eng_add(D, q, &r[i]);
    }
    loom_error err = {0};
    lent l[4] = {{0}};
    loom_kv_handoff h = lend(handoff_of(&ex, p), &l[0]);
    h.blocks_on_device = true, h.blocks_device = 0;
    cr_assert_eq(loom_engine_kv_deliver(D, id[0], &h, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "host memory only"), "%s", err.message);
    h.done = NULL;
    cr_assert_eq(loom_engine_kv_deliver(D, id[0], &h, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "done callback"), "%s", err.message);
    cr_assert_eq(l[0].calls, 0);
    cr_assert_eq(loom_engine_abort(D, id[0]), LOOM_OK);
    eng_run(D, 100);
    h = lend(handoff_of(&ex, p), &l[1]); /* no longer waits: dropped */
    cr_assert_eq(loom_engine_kv_deliver(D, id[0], &h, &err), LOOM_OK);
    eng_run(D, 100);
    cr_assert(l[1].calls == 1 && l[1].st == LOOM_ERR_NOT_FOUND, "done %d, status %d", l[1].calls, l[1].st);
    h = lend(handoff_of(&ex, p), &l[2]); /* queued, never stepped: dropped by the destroy */
    cr_assert_eq(loom_engine_kv_deliver(D, id[1], &h, &err), LOOM_OK);
    cr_assert_eq(l[2].calls, 0);
    loom_engine_destroy(D);
    cr_assert(l[2].calls == 1 && l[2].st != LOOM_OK, "done %d, status %d", l[2].calls, l[2].st);
    for (int i = 0; i < 2; i++) eng_rec_free(&r[i]);
    eng_rec_free(&ex.rec);
    free(ex.blocks);
    loom_engine_destroy(P);
}

Test(engine_kv, bad_handoff_failure_and_abort_end_one_request) {
    loom_engine *P = eng_open("tiny.yaml", NULL), *D = eng_open("tiny.yaml", NULL);
    int32_t p[40];
    exported ex;
    prefill_40(P, p, &ex);
    cr_assert_eq(ex.calls, 1);
    loom_error err = {0};
    eng_rec r[4];
    int64_t id[4];
    for (int i = 0; i < 4; i++) {
        eng_rec_init(&r[i], 1);
        loom_request q = eng_req_tokens(p, i == 0 ? 39 : 40, 4); /* request 0: another prompt length */
        q.kv_remote = true;
        id[i] = eng_add(D, q, &r[i]);
    }
    loom_kv_handoff h = handoff_of(&ex, p);
    cr_assert_eq(loom_engine_kv_deliver(D, id[0], &h, &err), LOOM_OK); /* checked at the step: mismatch */
    loom_kv_handoff bad = h; /* other block bytes, with a buffer of that size (the contract's) */
    bad.block_bytes += 4;
    void *bad_blocks = calloc((size_t)bad.num_blocks, bad.block_bytes);
    cr_assert_not_null(bad_blocks);
    bad.blocks = bad_blocks;
    cr_assert_eq(loom_engine_kv_deliver(D, id[1], &bad, &err), LOOM_OK);
    free(bad_blocks);
    cr_assert_eq(loom_engine_kv_fail(D, id[2], "the prefill server went away"), LOOM_OK);
    cr_assert_eq(loom_engine_abort(D, id[3]), LOOM_OK);
    eng_run(D, 100);
    cr_assert_eq(loom_engine_kv_deliver(D, id[3], &h, &err), LOOM_OK); /* too late: dropped */
    eng_run(D, 100);
    for (int i = 0; i < 4; i++) eng_rec_check_done(&r[i]);
    cr_assert_eq(r[0].s[0].finish, LOOM_FINISH_ERROR);
    cr_assert(strstr(r[0].s[0].error, "covers 39 tokens"), "%s", r[0].s[0].error);
    cr_assert_eq(r[1].s[0].finish, LOOM_FINISH_ERROR);
    cr_assert(strstr(r[1].s[0].error, "bytes"), "%s", r[1].s[0].error);
    cr_assert_eq(r[2].s[0].finish, LOOM_FINISH_ERROR);
    cr_assert_str_eq(r[2].s[0].error, "the prefill server went away");
    cr_assert_eq(r[3].s[0].finish, LOOM_FINISH_ABORT);
    for (int i = 0; i < 4; i++) cr_assert_eq(r[i].s[0].ntok, 0);
    expect_idle(P, "prefill");
    expect_idle(D, "decode");
    /* the refusals at add_request: n > 1, both roles at once */
    loom_request q = eng_req_tokens(p, 40, 4);
    q.kv_remote = true;
    q.n = 2;
    cr_assert_lt(loom_engine_add_request(D, &q, &err), 0);
    cr_assert(strstr(err.message, "n > 1"), "%s", err.message);
    q.n = 1;
    q.on_kv_export = on_export;
    cr_assert_lt(loom_engine_add_request(D, &q, &err), 0);
    for (int i = 0; i < 4; i++) eng_rec_free(&r[i]);
    eng_rec_free(&ex.rec);
    free(ex.blocks);
    loom_engine_destroy(P);
    loom_engine_destroy(D);
}
