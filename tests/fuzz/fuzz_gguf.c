/*
 * tests/fuzz/fuzz_gguf.c — a GGUF image in memory through everything a
 * model file goes through: the header and metadata reader, the model
 * config, the tensor checks and the Q/K reordering (loom_model_load with
 * opts.data), and the tokenizer built from its tokenizer.* keys.
 */
#include <stdint.h>

#include "fuzz_util.h"
#include "model/gguf.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    loom_error err = {0};
    loom_model_load_opts o = {.path = "fuzz.gguf", .format = "gguf", .data = data, .size = size};
    loom_model *m = NULL;
    loom_status st = loom_model_load(&o, &m, &err);
    fuzz_note("model", &err);
    if (st == LOOM_OK) {
        loom_model_free(m);
    } else {
        FUZZ_CHECK(m == NULL && err.message[0]);
    }
    /* the tokenizer is read from files whose model may not load */
    loom_gguf *g = NULL;
    if (loom_gguf_open_buffer(data, size, "fuzz.gguf", &g, &err) != LOOM_OK) return 0;
    loom_tokenizer *t = NULL;
    err.message[0] = 0;
    st = loom_tokenizer_from_gguf(g, &t, &err);
    fuzz_note("tokenizer", &err);
    if (st == LOOM_OK) {
        int32_t *ids = NULL, n = 0;
        static const char text[] = "Hello, world! <s> \xE2\x96\x81 12345\n\x00\xFF";
        if (loom_tokenizer_encode(t, text, sizeof text - 1, true, true, &ids, &n, &err) == LOOM_OK) {
            char *back = NULL;
            size_t len;
            if (loom_tokenizer_decode_bytes(t, ids, n, false, &back, &len, &err) == LOOM_OK) free(back);
            free(ids);
        }
        loom_tokenizer_free(t);
    }
    loom_gguf_close(g);
    return 0;
}
