/*
 * tests/fuzz/fuzz_disagg.c — what a KV peer can send (docs/disaggregation.md):
 * the connectors' frame header (kvc_frame_parse) and the core's messages
 * (a PREFILL request, a KV answer, an ERROR). Checked: an accepted frame
 * lies within the limits, an accepted prefill's tokens are inside the
 * vocabulary and fill the head exactly, an accepted KV answer's payload is
 * exactly its blocks, an error message is printable.
 *
 * Input: the first byte picks the parser (its low two bits; for a KV answer
 * the high six give the payload's size in blocks); the rest are the bytes a
 * peer sent.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "disagg/wire.h"
#include "kvc.h"

static const loom_kv_info k_info = {.struct_size = sizeof k_info, .block_size = 16, .block_bytes = 3072,
                                    .kv_dtype = LOOM_DTYPE_F32, .num_layers = 30, .vocab = 1000,
                                    .max_model_len = 4096};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    char why[256];
    switch (data[0] % 4) {
    case 0: {
        kvc_frame f;
        if (n >= KVC_HEADER_BYTES && kvc_frame_parse(d, 4096, 1 << 20, &f, why, sizeof why) &&
            (f.head_len > 4096 || f.payload_len > (1 << 20) || f.type == 0))
            abort();
        break;
    }
    case 1: {
        int32_t *t, m;
        if (disagg_prefill_parse(d, n, &k_info, &t, &m, why, sizeof why) == LOOM_OK) {
            if (m < 2 || n != DISAGG_PREFILL_FIXED + 4 * (size_t)m) abort();
            for (int32_t i = 0; i < m; i++)
                if (t[i] < 0 || t[i] >= k_info.vocab) abort();
            free(t);
        }
        break;
    }
    case 2: {
        loom_kv_handoff h;
        uint64_t pl = (uint64_t)(data[0] >> 2) * 3072; /* the selector's high bits: the payload's blocks */
        if (disagg_kv_parse(d, n, pl, 41, &k_info, &h, why, sizeof why) == LOOM_OK &&
            (h.num_tokens != 40 || pl != (uint64_t)h.num_blocks * h.block_bytes))
            abort();
        break;
    }
    default: {
        char msg[DISAGG_ERROR_MAX + 1];
        if (disagg_error_parse(d, n, msg, sizeof msg))
            for (const char *p = msg; *p; p++)
                if (*p < 0x20 || *p > 0x7E) abort();
    }
    }
    return 0;
}
