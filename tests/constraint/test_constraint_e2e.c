/*
 * tests/constraint/test_constraint_e2e.c — structured outputs through the
 * engine with SmolLM2 (LOOM_TEST_MODEL; skips when unset): a json_schema
 * request's text parses and has the schema's required members with their
 * types, json_object gives an object, a bad schema is refused at
 * add_request naming the problem, and a request that cannot run with the
 * pipeline (no constraint section) is refused too.
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/eng_util.h"
#include "loom/engine.h"

static const char *const k_no_overrides[] = {NULL};

static loom_engine *eng_open_path(const char *path, const char *const *overrides) {
    int32_t n = 0;
    while (overrides[n]) n++;
    loom_engine *e = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_engine_create(path, overrides, n, &e, &err), LOOM_OK, "%s: %s", path, err.message);
    return e;
}

static const char k_schema[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},"
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}";

static char *run_constrained(loom_engine *e, const char *lang, const char *text, uint64_t seed) {
    eng_rec rec;
    eng_rec_init(&rec, 1);
    loom_request r = loom_request_default();
    r.prompt = "Describe a person as JSON.";
    r.chat = true;
    r.max_tokens = 120;
    r.params.temperature = 0.8f;
    r.params.seed = seed;
    r.params.has_seed = true;
    r.constraint_lang = lang;
    r.constraint = text;
    eng_add(e, r, &rec);
    eng_run(e, 400);
    eng_rec_check_done(&rec);
    cr_assert_eq(rec.s[0].finish, LOOM_FINISH_EOS, "finish %d (%s), text: %.*s", rec.s[0].finish, rec.s[0].error,
                 (int)rec.s[0].len, rec.s[0].text);
    char *out = strndup(rec.s[0].text, rec.s[0].len);
    eng_rec_free(&rec);
    return out;
}

Test(constraint_e2e, json_schema_output_validates) {
    eng_need_model();
    char *pipe = eng_data_in("constraint", "smol.yaml");
    loom_engine *e = eng_open_path(pipe, k_no_overrides);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        char *text = run_constrained(e, "json_schema", k_schema, seed);
        cJSON *j = cJSON_Parse(text);
        cr_assert_not_null(j, "not JSON: %s", text);
        cr_assert(cJSON_IsString(cJSON_GetObjectItem(j, "name")), "%s", text);
        cr_assert(strlen(cJSON_GetObjectItem(j, "name")->valuestring) <= 20, "%s", text);
        const cJSON *age = cJSON_GetObjectItem(j, "age"), *tags = cJSON_GetObjectItem(j, "tags"), *t;
        cr_assert(cJSON_IsNumber(age) && age->valuedouble == (double)(long long)age->valuedouble, "%s", text);
        cr_assert(cJSON_IsArray(tags) && cJSON_GetArraySize(tags) <= 3, "%s", text);
        cJSON_ArrayForEach(t, tags) cr_assert(cJSON_IsString(t) && (!strcmp(t->valuestring, "a") || !strcmp(t->valuestring, "b")), "%s", text);
        cr_assert_eq(cJSON_GetArraySize(j), 3, "only the declared members: %s", text);
        cJSON_Delete(j);
        free(text);
    }
    loom_engine_destroy(e);
    free(pipe);
}

Test(constraint_e2e, json_object_output_is_an_object) {
    eng_need_model();
    char *pipe = eng_data_in("constraint", "smol.yaml");
    loom_engine *e = eng_open_path(pipe, k_no_overrides);
    char *text = run_constrained(e, "json_object", NULL, 7);
    cJSON *j = cJSON_Parse(text);
    cr_assert(cJSON_IsObject(j), "not a JSON object: %s", text);
    cJSON_Delete(j);
    free(text);
    loom_engine_destroy(e);
    free(pipe);
}

Test(constraint_e2e, bad_schema_is_refused_at_add_request) {
    eng_need_model();
    char *pipe = eng_data_in("constraint", "smol.yaml");
    loom_engine *e = eng_open_path(pipe, k_no_overrides);
    loom_request r = loom_request_default();
    r.prompt = "x";
    r.constraint_lang = "json_schema";
    r.constraint = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"multipleOf\":2}}}";
    loom_error err = {0};
    cr_assert_eq(loom_engine_add_request(e, &r, &err), -1);
    cr_assert(strstr(err.message, "multipleOf") && strstr(err.message, "#/properties/a"), "%s", err.message);
    r.constraint = "{\"type\": \"object\", ";
    cr_assert_eq(loom_engine_add_request(e, &r, &err), -1);
    cr_assert(strstr(err.message, "not valid JSON"), "%s", err.message);
    r.constraint_lang = "lark";
    cr_assert_eq(loom_engine_add_request(e, &r, &err), -1);
    cr_assert(strstr(err.message, "unknown language"), "%s", err.message);
    loom_engine_destroy(e);
    free(pipe);
}

/* What a constraint cannot run with is refused at add_request, naming it. */
Test(constraint_e2e, unsupported_combinations_refused) {
    eng_need_model();
    char *pipe = eng_data_in("constraint", "smol.yaml");
    static const char *const spec[] = {"speculator.plugin=ngram", NULL};
    loom_engine *e = eng_open_path(pipe, spec);
    loom_request r = loom_request_default();
    r.prompt = "x";
    r.constraint_lang = "json_object";
    loom_error err = {0};
    cr_assert_eq(loom_engine_add_request(e, &r, &err), -1);
    cr_assert(strstr(err.message, "speculative decoding"), "%s", err.message);
    loom_engine_destroy(e);
    e = eng_open_path(pipe, k_no_overrides);
    r.ignore_eos = true;
    cr_assert_eq(loom_engine_add_request(e, &r, &err), -1);
    cr_assert(strstr(err.message, "ignore_eos"), "%s", err.message);
    r.ignore_eos = false;
    r.want_probs = true;
    cr_assert_eq(loom_engine_add_request(e, &r, &err), -1);
    cr_assert(strstr(err.message, "want_probs"), "%s", err.message);
    loom_engine_destroy(e);
    free(pipe);
}

Test(constraint_e2e, no_constraint_slot_is_refused) {
    eng_need_model();
    char *pipe = eng_data_in("constraint", "smol.yaml");
    static const char *const off[] = {"constraint=null", NULL};
    loom_engine *e = eng_open_path(pipe, off);
    loom_request r = loom_request_default();
    r.prompt = "x";
    r.constraint_lang = "json_object";
    loom_error err = {0};
    cr_assert_eq(loom_engine_add_request(e, &r, &err), -1);
    cr_assert(strstr(err.message, "no constraint section"), "%s", err.message);
    loom_engine_destroy(e);
    free(pipe);
}

/* A grammar that can never end, under a small stack-depth limit: once the
 * limit is reached nothing may follow, and the sample ends with an error
 * naming the dead end instead of text outside the grammar. */
Test(constraint_e2e, dead_end_finishes_with_an_error) {
    eng_need_model();
    char *pipe = eng_data_in("constraint", "smol.yaml");
    static const char *const small[] = {"constraint.max_stack_depth=8", NULL};
    loom_engine *e = eng_open_path(pipe, small);
    eng_rec rec;
    eng_rec_init(&rec, 1);
    loom_request r = loom_request_default();
    r.prompt = "Brackets:";
    r.max_tokens = 60;
    r.constraint_lang = "gbnf";
    r.constraint = "root ::= \"[\" root \"]\"";
    eng_add(e, r, &rec);
    eng_run(e, 200);
    eng_rec_check_done(&rec);
    cr_assert_eq(rec.s[0].finish, LOOM_FINISH_ERROR, "finish %d, text %.*s", rec.s[0].finish, (int)rec.s[0].len,
                 rec.s[0].text);
    cr_assert(strstr(rec.s[0].error, "dead end"), "%s", rec.s[0].error);
    for (size_t i = 0; i < rec.s[0].len; i++) cr_assert_eq(rec.s[0].text[i], '[', "%.*s", (int)rec.s[0].len, rec.s[0].text);
    eng_rec_free(&rec);
    loom_engine_destroy(e);
    free(pipe);
}

/* n > 1: every sample has its own matcher (forks start fresh) and each
 * answer is a JSON object. */
Test(constraint_e2e, forked_samples_each_follow_the_constraint) {
    eng_need_model();
    char *pipe = eng_data_in("constraint", "smol.yaml");
    loom_engine *e = eng_open_path(pipe, k_no_overrides);
    eng_rec rec;
    eng_rec_init(&rec, 3);
    loom_request r = loom_request_default();
    r.prompt = "A JSON object:";
    r.n = 3;
    r.max_tokens = 60;
    r.params.temperature = 1.0f;
    r.params.seed = 11;
    r.params.has_seed = true;
    r.constraint_lang = "regex";
    r.constraint = "\\{\"n\": [0-9]{1,3}\\}";
    eng_add(e, r, &rec);
    eng_run(e, 300);
    eng_rec_check_done(&rec);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(rec.s[k].finish, LOOM_FINISH_EOS, "sample %d: finish %d (%s)", k, rec.s[k].finish,
                     rec.s[k].error);
        char *t = strndup(rec.s[k].text, rec.s[k].len);
        cJSON *j = cJSON_Parse(t);
        cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(j, "n")), "sample %d: %s", k, t);
        cJSON_Delete(j);
        free(t);
    }
    eng_rec_free(&rec);
    loom_engine_destroy(e);
    free(pipe);
}

/* Four constrained requests in one batch (greedy and top_k 20 with seeds,
 * json_schema and json_object); recs[4]. */
static void run_masked_batch(loom_engine *e, eng_rec *recs, loom_engine_stats *st) {
    for (int i = 0; i < 4; i++) {
        eng_rec_init(&recs[i], 1);
        loom_request r = loom_request_default();
        r.prompt = i % 2 ? "Describe a person as JSON." : "Give me a JSON object about a city.";
        r.chat = true;
        r.max_tokens = 60;
        r.params.temperature = i < 2 ? 0.0f : 0.8f;
        r.params.top_k = i < 2 ? 0 : 20;
        r.params.seed = 7 + (uint64_t)i;
        r.params.has_seed = true;
        r.constraint_lang = i == 3 ? "json_object" : "json_schema";
        r.constraint = i == 3 ? NULL : k_schema;
        eng_add(e, r, &recs[i]);
    }
    eng_run(e, 400);
    loom_engine_get_stats(e, st, sizeof *st);
    for (int i = 0; i < 4; i++) eng_rec_check_done(&recs[i]);
}

/* Constrained rows as masked candidates (loom_logits_topk.allowed, ABI
 * 2.4) give the same tokens and log-probs as whole rows masked by the
 * sampler (engine.device_sampling false): the candidates are the best
 * allowed tokens, the log-sum-exp the raw row's. Through the cpu
 * backend's forward_topk and through the pp executor in two stages and
 * two micro-batches (each reducing its part of the rows). */
Test(constraint_e2e, masked_candidates_equal_whole_rows, .timeout = 900) {
    eng_need_model();
    char *pipe = eng_data_in("constraint", "smol.yaml");
    const char *const whole_ov[] = {"engine.device_sampling=false", NULL};
    const char *const pp[] = {"executor.plugin=pp", "executor.pp_size=2", "executor.micro_batches=2", NULL};
    const char *const tp[] = {"executor.plugin=tp", "executor.size=1", "executor.comm=threads",
                              "engine.mask_threads=3", NULL};
    const char *const *cand_ov[] = {k_no_overrides, pp, tp};
    eng_rec whole[4], cand[4];
    loom_engine_stats sw, sc;
    loom_engine *e = eng_open_path(pipe, whole_ov);
    run_masked_batch(e, whole, &sw);
    loom_engine_destroy(e);
    cr_assert_eq(sw.device_sampled_rows, 0);
    cr_assert_eq(sw.constraint_masks, 0, "whole rows: the sampler masks them, no fill_masks");
    cr_assert_gt(sw.constraint_accept_seconds, 0.0);
    for (int c = 0; c < 3; c++) {
        e = eng_open_path(pipe, cand_ov[c]);
        run_masked_batch(e, cand, &sc);
        loom_engine_destroy(e);
        cr_assert_gt(sc.device_sampled_rows, 100, "run %d: constrained rows came as candidates (%lld)", c,
                     (long long)sc.device_sampled_rows);
        /* every candidate row of a constrained request had its mask computed (fill_masks), timed */
        cr_assert_geq(sc.constraint_masks, sc.device_sampled_rows, "run %d: %lld masks for %lld rows", c,
                      (long long)sc.constraint_masks, (long long)sc.device_sampled_rows);
        cr_assert_gt(sc.constraint_mask_seconds, 0.0);
        cr_assert_gt(sc.constraint_accept_seconds, 0.0);
        for (int i = 0; i < 4; i++) {
            const eng_sample *a = &whole[i].s[0], *b = &cand[i].s[0];
            cr_assert_eq(a->ntok, b->ntok, "run %d request %d: %d vs %d tokens", c, i, a->ntok, b->ntok);
            for (int32_t t = 0; t < a->ntok; t++) {
                cr_assert_eq(a->tokens[t], b->tokens[t], "run %d request %d token %d", c, i, t);
                cr_assert_float_eq(a->lps[t], b->lps[t], 1e-4, "run %d request %d token %d: logprob %g vs %g", c, i,
                                   t, a->lps[t], b->lps[t]);
            }
            cr_assert_eq(b->finish, LOOM_FINISH_EOS, "run %d request %d: %s", c, i, b->error);
            cJSON *j = cJSON_ParseWithLength(b->text, b->len);
            cr_assert(cJSON_IsObject(j), "run %d request %d: %.*s", c, i, (int)b->len, b->text);
            cJSON_Delete(j);
            eng_rec_free(&cand[i]);
        }
    }
    for (int i = 0; i < 4; i++) eng_rec_free(&whole[i]);
    free(pipe);
}

/* A grammar too ambiguous to match within the plugin's work budget
 * (max_match_steps, small here): its request ends with an error naming the
 * limit and the grammar, and a request beside it in the same steps goes on
 * to its end (the failure is the request's, not the step's). */
Test(constraint_e2e, work_budget_fails_only_its_request) {
    eng_need_model();
    char *pipe = eng_data_in("constraint", "smol.yaml");
    static const char *const small[] = {"constraint.max_match_steps=100000", "constraint.max_stack_depth=64", NULL};
    loom_engine *e = eng_open_path(pipe, small);
    /* every one of 2^80 paths after the "q" is deeper than max_stack_depth
     * (the distinct stacks explode: the one case the expansion's
     * once-per-stack rule does not make cheap) */
    char grammar[4096];
    int at = snprintf(grammar, sizeof grammar, "root ::= \"q\" r1\n");
    for (int i = 1; i < 80; i++)
        at += snprintf(grammar + at, sizeof grammar - (size_t)at, "r%d ::= r%d \"x\" | r%d \"y\"\n", i, i + 1, i + 1);
    snprintf(grammar + at, sizeof grammar - (size_t)at, "r80 ::= \"z\"\n");
    eng_rec bad, good;
    eng_rec_init(&bad, 1);
    eng_rec_init(&good, 1);
    loom_request r = loom_request_default();
    r.prompt = "Write:";
    r.max_tokens = 40;
    r.constraint_lang = "gbnf";
    r.constraint = grammar;
    eng_add(e, r, &bad);
    r.constraint_lang = "regex";
    r.constraint = "\\{\"n\": [0-9]{1,3}\\}";
    eng_add(e, r, &good);
    eng_run(e, 200);
    eng_rec_check_done(&bad);
    eng_rec_check_done(&good);
    cr_assert_eq(bad.s[0].finish, LOOM_FINISH_ERROR, "finish %d, text %.*s", bad.s[0].finish, (int)bad.s[0].len,
                 bad.s[0].text);
    cr_assert(strstr(bad.s[0].error, "max_match_steps (100000)") && strstr(bad.s[0].error, "gbnf `root ::= \"q\""),
              "%s", bad.s[0].error);
    cr_assert_eq(good.s[0].finish, LOOM_FINISH_EOS, "finish %d (%s)", good.s[0].finish, good.s[0].error);
    eng_rec_free(&bad);
    eng_rec_free(&good);
    loom_engine_destroy(e);
    free(pipe);
}

/* A matcher that refuses a token it is handed (a work budget or memory
 * running out; constraint "flaky" refuses its 3rd): the engine hands a
 * token over just before the sample's next mask, so the sample ends one
 * token later with the plugin's message, after exactly the tokens it had
 * streamed; a sample whose last token is the refused one ends normally. */
Test(constraint_e2e, refused_token_ends_the_sample_one_token_later) {
    eng_need_model();
    char *pipe = eng_data_in("constraint", "smol.yaml");
    const char *ov[] = {"constraint.plugin=flaky", "constraint.fail_at=3", NULL};
    loom_engine *e = eng_open_path(pipe, ov);
    const int32_t max_tokens[2] = {8, 3};
    for (int k = 0; k < 2; k++) {
        eng_rec rec;
        eng_rec_init(&rec, 1);
        loom_request r = loom_request_default();
        r.prompt = "Say something.";
        r.max_tokens = max_tokens[k];
        r.constraint_lang = "any";
        r.constraint = "";
        eng_add(e, r, &rec);
        eng_run(e, 100);
        eng_rec_check_done(&rec);
        if (k == 0) {
            cr_assert_eq(rec.s[0].finish, LOOM_FINISH_ERROR, "finish %d", rec.s[0].finish);
            cr_assert(rec.s[0].error && strstr(rec.s[0].error, "token 3 refused"), "%s", rec.s[0].error);
            cr_assert_eq(rec.s[0].ntok, 3, "%d tokens before the refusal", rec.s[0].ntok);
        } else {
            cr_assert_eq(rec.s[0].finish, LOOM_FINISH_LENGTH, "finish %d (%s)", rec.s[0].finish, rec.s[0].error);
            cr_assert_eq(rec.s[0].ntok, 3);
        }
        eng_rec_free(&rec);
    }
    loom_engine_destroy(e);
    free(pipe);
}
