/*
 * tests/model/test_gguf.c — the GGUF reader: every metadata type read back,
 * v2/v3, alignment, tensor records, and every malformed-input path (bad
 * magic, version 1, truncation at every byte, out-of-bounds and misaligned
 * data, unknown/unsupported types, duplicates, hostile counts).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_writer.h"
#include "model/gguf.h"

static loom_gguf *open_ok(const gw *w) {
    loom_gguf *g = NULL;
    loom_error err = {0};
    loom_status st = loom_gguf_open_buffer(w->buf, w->len, "test.gguf", &g, &err);
    cr_assert_eq(st, LOOM_OK, "open failed: %s", err.message);
    return g;
}

static loom_status open_err(const gw *w, loom_error *err) {
    loom_gguf *g = NULL;
    memset(err, 0, sizeof *err);
    loom_status st = loom_gguf_open_buffer(w->buf, w->len, "bad.gguf", &g, err);
    cr_assert_null(g);
    cr_assert_neq(st, LOOM_OK);
    cr_assert(strstr(err->message, "bad.gguf") != NULL, "message does not name the file: %s", err->message);
    return st;
}

/* A small valid file with two tensors; data of the last ends at EOF. */
static float g_t0[8] = {1, 2, 3, 4, 5, 6, 7, 8};
static uint16_t g_t1[6] = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600}; /* f16 1..6 */

static void build_small(gb *b) {
    gb_init(b);
    gb_s(b, "general.architecture", "llama");
    gb_u32(b, "llama.block_count", 2);
    gb_strarr(b, "tokenizer.ggml.tokens", 5, "tok");
    uint64_t ne0[2] = {4, 2}, ne1[2] = {3, 2};
    gb_tensor_add(b, "a.weight", GG_F32, 2, ne0, g_t0, sizeof g_t0);
    gb_tensor_add(b, "b.weight", GG_F16, 2, ne1, g_t1, sizeof g_t1);
}

Test(model, gguf_every_metadata_type) {
    gb b;
    gb_init(&b);
    gw *w;
    w = gb_key(&b, "t.u8", GT_U8); gw_u8(w, 200);
    w = gb_key(&b, "t.i8", GT_I8); gw_u8(w, (uint8_t)-5);
    w = gb_key(&b, "t.u16", GT_U16); gw_u16(w, 60000);
    w = gb_key(&b, "t.i16", GT_I16); gw_u16(w, (uint16_t)-300);
    w = gb_key(&b, "t.u32", GT_U32); gw_u32(w, 4000000000u);
    w = gb_key(&b, "t.i32", GT_I32); gw_u32(w, (uint32_t)-70000);
    w = gb_key(&b, "t.f32", GT_F32); gw_f32(w, 1.5f);
    w = gb_key(&b, "t.bool", GT_BOOL); gw_u8(w, 1);
    w = gb_key(&b, "t.str", GT_STR); gw_str(w, "hello");
    w = gb_key(&b, "t.u64", GT_U64); gw_u64(w, UINT64_MAX);
    w = gb_key(&b, "t.i64", GT_I64); gw_u64(w, (uint64_t)INT64_MIN);
    w = gb_key(&b, "t.f64", GT_F64); gw_f64(w, -2.25);
    /* arrays of every scalar type */
    w = gb_key(&b, "a.i16", GT_ARR); gw_u32(w, GT_I16); gw_u64(w, 3);
    gw_u16(w, 1); gw_u16(w, (uint16_t)-2); gw_u16(w, 3);
    w = gb_key(&b, "a.f32", GT_ARR); gw_u32(w, GT_F32); gw_u64(w, 2); gw_f32(w, 0.5f); gw_f32(w, -4.0f);
    w = gb_key(&b, "a.bool", GT_ARR); gw_u32(w, GT_BOOL); gw_u64(w, 2); gw_u8(w, 0); gw_u8(w, 1);
    w = gb_key(&b, "a.u64", GT_ARR); gw_u32(w, GT_U64); gw_u64(w, 1); gw_u64(w, 12345678901ull);
    w = gb_key(&b, "a.f64", GT_ARR); gw_u32(w, GT_F64); gw_u64(w, 1); gw_f64(w, 3.25);
    w = gb_key(&b, "a.empty", GT_ARR); gw_u32(w, GT_U8); gw_u64(w, 0);
    gb_strarr(&b, "a.str", 4, "s");
    /* array of arrays: [[1,2],[3]] of u32, then [["x"],[]] of strings: skipped correctly */
    w = gb_key(&b, "a.nested", GT_ARR); gw_u32(w, GT_ARR); gw_u64(w, 2);
    gw_u32(w, GT_U32); gw_u64(w, 2); gw_u32(w, 1); gw_u32(w, 2);
    gw_u32(w, GT_U32); gw_u64(w, 1); gw_u32(w, 3);
    w = gb_key(&b, "a.nested_str", GT_ARR); gw_u32(w, GT_ARR); gw_u64(w, 2);
    gw_u32(w, GT_STR); gw_u64(w, 1); gw_str(w, "x");
    gw_u32(w, GT_STR); gw_u64(w, 0);
    gb_s(&b, "after.nested", "still readable");
    gw f = gb_finish(&b);
    loom_gguf *g = open_ok(&f);

    int64_t i;
    double d;
    bool bo;
    loom_gguf_str s;
    cr_assert(loom_gguf_get_i64(g, "t.u8", &i) && i == 200);
    cr_assert(loom_gguf_get_i64(g, "t.i8", &i) && i == -5);
    cr_assert(loom_gguf_get_i64(g, "t.u16", &i) && i == 60000);
    cr_assert(loom_gguf_get_i64(g, "t.i16", &i) && i == -300);
    cr_assert(loom_gguf_get_i64(g, "t.u32", &i) && i == 4000000000ll);
    cr_assert(loom_gguf_get_i64(g, "t.i32", &i) && i == -70000);
    cr_assert(loom_gguf_get_f64(g, "t.f32", &d) && d == 1.5);
    cr_assert(!loom_gguf_get_i64(g, "t.f32", &i), "float is not an integer");
    cr_assert(loom_gguf_get_bool(g, "t.bool", &bo) && bo);
    cr_assert(loom_gguf_get_str(g, "t.str", &s) && loom_gguf_str_eq(s, "hello"));
    cr_assert(!loom_gguf_get_i64(g, "t.u64", &i), "UINT64_MAX does not fit int64");
    cr_assert(loom_gguf_get_f64(g, "t.u64", &d) && d == (double)UINT64_MAX);
    cr_assert(loom_gguf_get_i64(g, "t.i64", &i) && i == INT64_MIN);
    cr_assert(loom_gguf_get_f64(g, "t.f64", &d) && d == -2.25);
    cr_assert(loom_gguf_get_f64(g, "t.i32", &d) && d == -70000.0);
    cr_assert(!loom_gguf_get_str(g, "t.u8", &s));
    cr_assert(!loom_gguf_get_bool(g, "t.u8", &bo));
    cr_assert(!loom_gguf_get_i64(g, "no.such.key", &i));
    cr_assert_eq(loom_gguf_find(g, "no.such.key"), -1);

    loom_gguf_type et;
    uint64_t len;
    cr_assert(loom_gguf_get_arr(g, "a.i16", &et, &len) && et == LOOM_GGUF_INT16 && len == 3);
    cr_assert(loom_gguf_arr_i64(g, "a.i16", 1, &i) && i == -2);
    cr_assert(!loom_gguf_arr_i64(g, "a.i16", 3, &i), "out of range");
    const uint8_t *raw = loom_gguf_arr_data(g, "a.i16");
    cr_assert_not_null(raw);
    int16_t v16;
    memcpy(&v16, raw + 4, 2);
    cr_assert_eq(v16, 3);
    cr_assert(loom_gguf_arr_f64(g, "a.f32", 1, &d) && d == -4.0);
    cr_assert(loom_gguf_arr_i64(g, "a.bool", 1, &i) == false);
    cr_assert(loom_gguf_get_arr(g, "a.bool", &et, &len) && et == LOOM_GGUF_BOOL && len == 2);
    cr_assert(loom_gguf_arr_i64(g, "a.u64", 0, &i) && i == 12345678901ll);
    cr_assert(loom_gguf_arr_f64(g, "a.f64", 0, &d) && d == 3.25);
    cr_assert(loom_gguf_get_arr(g, "a.empty", &et, &len) && len == 0);
    cr_assert(loom_gguf_get_arr(g, "a.str", &et, &len) && et == LOOM_GGUF_STRING && len == 4);
    cr_assert(loom_gguf_str_eq(loom_gguf_arr_str(g, "a.str", 3), "s3"));
    cr_assert_null(loom_gguf_arr_str(g, "a.str", 4).ptr);
    cr_assert_null(loom_gguf_arr_data(g, "a.str"));
    cr_assert(loom_gguf_get_arr(g, "a.nested", &et, &len) && et == LOOM_GGUF_ARRAY && len == 2);
    cr_assert_null(loom_gguf_arr_data(g, "a.nested"));
    cr_assert(loom_gguf_get_str(g, "after.nested", &s) && loom_gguf_str_eq(s, "still readable"));

    /* enumeration in file order */
    cr_assert_eq(loom_gguf_num_kv(g), 22);
    cr_assert(loom_gguf_str_eq(loom_gguf_key(g, 0), "t.u8"));
    cr_assert_eq(loom_gguf_kv_type(g, 8), LOOM_GGUF_STRING);
    cr_assert_eq(loom_gguf_kv_type(g, loom_gguf_find(g, "a.nested")), LOOM_GGUF_ARRAY);
    cr_assert_eq(loom_gguf_alignment(g), 32);
    cr_assert_eq(loom_gguf_num_tensors(g), 0);
    loom_gguf_close(g);
    free(f.buf);
    gb_free(&b);
}

Test(model, gguf_tensors_v2_v3_and_alignment) {
    for (int ver = 2; ver <= 3; ver++) {
        for (int al = 0; al < 2; al++) {
            gb b;
            build_small(&b);
            b.version = (uint32_t)ver;
            if (al) {
                b.alignment = 64;
                gb_u32(&b, "general.alignment", 64);
            }
            gw f = gb_finish(&b);
            loom_gguf *g = open_ok(&f);
            cr_assert_eq(loom_gguf_version(g), (uint32_t)ver);
            cr_assert_eq(loom_gguf_alignment(g), al ? 64u : 32u);
            cr_assert_eq(loom_gguf_data_offset(g) % (al ? 64 : 32), 0);
            cr_assert_eq(loom_gguf_num_tensors(g), 2);
            const loom_gguf_tensor_info *t = loom_gguf_find_tensor(g, "b.weight");
            cr_assert_not_null(t);
            cr_assert(t->supported && t->dtype == LOOM_DTYPE_F16 && t->n_dims == 2);
            cr_assert(t->ne[0] == 3 && t->ne[1] == 2 && t->nbytes == 12);
            cr_assert_eq(memcmp(t->data, g_t1, 12), 0);
            cr_assert_eq(t->offset % (al ? 64 : 32), 0);
            t = loom_gguf_find_tensor(g, "a.weight");
            cr_assert(t && memcmp(t->data, g_t0, sizeof g_t0) == 0 && t->dtype == LOOM_DTYPE_F32);
            cr_assert_eq(loom_gguf_tensor(g, 0), t);
            cr_assert_null(loom_gguf_find_tensor(g, "c.weight"));
            cr_assert_null(loom_gguf_find_tensor(g, "a.weigh"));
            loom_gguf_close(g);
            free(f.buf);
            gb_free(&b);
        }
    }
}

Test(model, gguf_file_open_and_missing) {
    gb b;
    build_small(&b);
    gw f = gb_finish(&b);
    char path[] = "/tmp/loom-gguf-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(gw_write_file(&f, path), 0);
    loom_gguf *g = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_gguf_open(path, &g, &err), LOOM_OK, "%s", err.message);
    cr_assert_str_eq(loom_gguf_path(g), path);
    cr_assert_eq(loom_gguf_num_tensors(g), 2);
    loom_gguf_close(g);
    /* truncated on disk: same checks through the mmap path */
    for (size_t cut = 0; cut < f.len; cut += 37) {
        FILE *fp = fopen(path, "wb");
        fwrite(f.buf, 1, cut, fp);
        fclose(fp);
        memset(&err, 0, sizeof err);
        cr_assert_eq(loom_gguf_open(path, &g, &err), LOOM_ERR_FORMAT, "cut %zu", cut);
        cr_assert(strstr(err.message, path) && strstr(err.message, "byte"), "%s", err.message);
    }
    unlink(path);
    cr_assert_eq(loom_gguf_open(path, &g, &err), LOOM_ERR_NOT_FOUND);
    cr_assert(strstr(err.message, path));
    cr_assert_neq(loom_gguf_open("/tmp", &g, &err), LOOM_OK);
    free(f.buf);
    gb_free(&b);
}

Test(model, gguf_bad_magic_and_versions) {
    gb b;
    build_small(&b);
    gw f = gb_finish(&b);
    loom_error err;
    memcpy(f.buf, "GGML", 4);
    cr_assert_eq(open_err(&f, &err), LOOM_ERR_FORMAT);
    cr_assert(strstr(err.message, "not a GGUF file (magic 47 47 4d 4c"), "%s", err.message);
    memcpy(f.buf, "GGUF", 4);
    uint32_t v = 1;
    memcpy(f.buf + 4, &v, 4);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "unsupported GGUF version 1"), "%s", err.message);
    v = 4;
    memcpy(f.buf + 4, &v, 4);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "unsupported GGUF version 4"), "%s", err.message);
    v = 0x03000000; /* big-endian v3 */
    memcpy(f.buf + 4, &v, 4);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "big-endian"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
}

Test(model, gguf_truncated_at_every_byte) {
    gb b;
    build_small(&b);
    gw *w = gb_key(&b, "x.nested", GT_ARR);
    gw_u32(w, GT_ARR); gw_u64(w, 1); gw_u32(w, GT_STR); gw_u64(w, 2); gw_str(w, "ab"); gw_str(w, "c");
    w = gb_key(&b, "x.b", GT_BOOL); gw_u8(w, 1);
    gw f = gb_finish(&b);
    cr_assert_gt(f.len, 300);
    for (size_t cut = 0; cut < f.len; cut++) {
        gw t = {f.buf, cut, cut};
        loom_error err;
        cr_assert_eq(open_err(&t, &err), LOOM_ERR_FORMAT, "cut at %zu: %s", cut, err.message);
        cr_assert(strstr(err.message, "byte") || strstr(err.message, "past the end"), "cut %zu: %s", cut,
                  err.message);
    }
    loom_gguf_close(open_ok(&f));
    free(f.buf);
    gb_free(&b);
}

Test(model, gguf_truncation_message_names_field) {
    gb b;
    build_small(&b);
    gw f = gb_finish(&b);
    gw t = {f.buf, 10, 10};
    loom_error err;
    open_err(&t, &err);
    cr_assert(strstr(err.message, "truncated at byte 8 while reading the tensor and metadata counts"), "%s",
              err.message);
    t.len = f.len - 1;
    open_err(&t, &err);
    cr_assert(strstr(err.message, "b.weight") && strstr(err.message, "truncated"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
}

Test(model, gguf_tensor_out_of_bounds_and_misaligned) {
    loom_error err;
    gb b;
    build_small(&b);
    b.t[1].offset_override = 4096;
    gw f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "b.weight") && strstr(err.message, "past the end"), "%s", err.message);
    free(f.buf);
    b.t[1].offset_override = 40; /* not a multiple of 32 */
    f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "b.weight") && strstr(err.message, "alignment"), "%s", err.message);
    free(f.buf);
    b.t[1].offset_override = (int64_t)1 << 62; /* huge, aligned: must not wrap around */
    f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "b.weight"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
}

Test(model, gguf_bad_alignment_key) {
    loom_error err;
    gb b;
    build_small(&b);
    gb_u32(&b, "general.alignment", 48);
    gw f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "general.alignment") && strstr(err.message, "power of two"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
    build_small(&b);
    gb_u32(&b, "general.alignment", 0);
    f = gb_finish(&b);
    open_err(&f, &err);
    free(f.buf);
    gb_free(&b);
}

Test(model, gguf_unsupported_and_unknown_types) {
    static uint8_t blocks[66 * 2];
    memset(blocks, 0x11, sizeof blocks);
    gb b;
    build_small(&b);
    uint64_t ne[2] = {256, 2};
    gb_tensor_add(&b, "iq.weight", GG_IQ2_XXS, 2, ne, blocks, sizeof blocks);
    gw f = gb_finish(&b);
    loom_gguf *g = open_ok(&f);
    const loom_gguf_tensor_info *t = loom_gguf_find_tensor(g, "iq.weight");
    cr_assert(t && !t->supported && t->ggml_type == 16 && t->nbytes == sizeof blocks);
    cr_assert_str_eq(loom_gguf_type_name(t->ggml_type), "iq2_xxs");
    loom_gguf_close(g);
    free(f.buf);
    /* unknown number (4 was removed from ggml) */
    b.t[2].type = 4;
    f = gb_finish(&b);
    loom_error err;
    open_err(&f, &err);
    cr_assert(strstr(err.message, "iq.weight") && strstr(err.message, "unknown GGML type 4"), "%s", err.message);
    free(f.buf);
    /* block type with a row not a multiple of its block */
    b.t[2].type = GG_Q8_0;
    b.t[2].ne[0] = 48;
    f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "block size"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
}

Test(model, gguf_bad_tensor_records) {
    loom_error err;
    struct {
        int what;
        const char *expect;
    } cases[] = {
        {0, "5 dimensions"}, {1, "0 dimensions"}, {2, "must be > 0"}, {3, "overflows"}, {4, "name length of 0"},
        {5, "name length of 65"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gb b;
        build_small(&b);
        gb_tensor *t = &b.t[0];
        switch (cases[c].what) {
        case 0: t->nd = 5; break;
        case 1: t->nd = 0; break;
        case 2: t->ne[1] = 0; break;
        case 3: t->nd = 4; t->ne[1] = 1ull << 40; t->ne[2] = 1ull << 40; t->ne[3] = 4; break;
        case 4: t->name[0] = 0; break;
        case 5: memset(t->name, 'x', 65); t->name[65] = 0; break;
        }
        gw f = gb_finish(&b);
        open_err(&f, &err);
        cr_assert(strstr(err.message, cases[c].expect), "case %zu: %s", c, err.message);
        free(f.buf);
        gb_free(&b);
    }
}

Test(model, gguf_duplicates) {
    loom_error err;
    gb b;
    build_small(&b);
    snprintf(b.t[1].name, sizeof b.t[1].name, "a.weight");
    gw f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "duplicate tensor name 'a.weight'"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
    build_small(&b);
    gb_u32(&b, "llama.block_count", 3);
    f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "duplicate metadata key 'llama.block_count'"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
}

Test(model, gguf_bad_values) {
    loom_error err;
    gb b;
    gw *w;
    /* bool not 0/1 */
    gb_init(&b);
    w = gb_key(&b, "x.bool", GT_BOOL);
    gw_u8(w, 2);
    gw f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "x.bool") && strstr(err.message, "must be 0 or 1"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
    /* invalid value type */
    gb_init(&b);
    w = gb_key(&b, "x.what", 13);
    gw_u32(w, 0);
    f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "invalid value type 13"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
    /* invalid array element type */
    gb_init(&b);
    w = gb_key(&b, "x.arr", GT_ARR);
    gw_u32(w, 99);
    gw_u64(w, 0);
    f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "element type 99"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
    /* array length far beyond the file: rejected before any allocation or loop */
    gb_init(&b);
    w = gb_key(&b, "x.huge", GT_ARR);
    gw_u32(w, GT_STR);
    gw_u64(w, 1ull << 61);
    f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "x.huge"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
    /* arrays nested too deep */
    gb_init(&b);
    w = gb_key(&b, "x.deep", GT_ARR);
    for (int i = 0; i < 20; i++) {
        gw_u32(w, GT_ARR);
        gw_u64(w, 1);
    }
    gw_u32(w, GT_U8);
    gw_u64(w, 0);
    f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "nested"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
    /* key with NUL / empty key */
    gb_init(&b);
    w = gb_key(&b, "", GT_U8);
    gw_u8(w, 0);
    f = gb_finish(&b);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "key length of 0"), "%s", err.message);
    free(f.buf);
    gb_free(&b);
}

Test(model, gguf_hostile_counts) {
    loom_error err;
    gw f = {0};
    gw_raw(&f, "GGUF", 4);
    gw_u32(&f, 3);
    gw_u64(&f, 0);
    gw_u64(&f, 1ull << 60);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "metadata entries"), "%s", err.message);
    free(f.buf);
    f = (gw){0};
    gw_raw(&f, "GGUF", 4);
    gw_u32(&f, 3);
    gw_u64(&f, UINT64_MAX);
    gw_u64(&f, 0);
    open_err(&f, &err);
    cr_assert(strstr(err.message, "tensors"), "%s", err.message);
    free(f.buf);
}

Test(model, gguf_real_model) {
    const char *path = getenv("LOOM_TEST_MODEL");
    if (!path || !*path) cr_skip_test("LOOM_TEST_MODEL not set (scripts/fetch-model.sh prints the path)");
    loom_gguf *g = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_gguf_open(path, &g, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(loom_gguf_version(g), 3);
    cr_assert_eq(loom_gguf_num_tensors(g), 272);
    loom_gguf_str s;
    cr_assert(loom_gguf_get_str(g, "general.architecture", &s) && loom_gguf_str_eq(s, "llama"));
    loom_gguf_type et;
    uint64_t n;
    cr_assert(loom_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) && n == 49152 && et == LOOM_GGUF_STRING);
    cr_assert(loom_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n) && n == 48900);
    cr_assert_gt(loom_gguf_arr_str(g, "tokenizer.ggml.tokens", 49151).len, 0);
    const loom_gguf_tensor_info *t = loom_gguf_find_tensor(g, "blk.0.ffn_down.weight");
    cr_assert(t && t->dtype == LOOM_DTYPE_Q4_1 && t->ne[0] == 1536 && t->ne[1] == 576);
    loom_gguf_close(g);
}
