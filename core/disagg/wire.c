/*
 * core/disagg/wire.c — encode and parse the disaggregation messages
 * (wire.h). Parsers never trust a length the peer wrote: each is checked
 * against the head's real size and this engine's own limits first.
 */
#include "disagg/wire.h"

#include "formats/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC_PREFILL 0x504B4C4Cu /* "LLKP" */
#define MAGIC_KV 0x4B4B4C4Cu      /* "LLKK" */
#define MAGIC_ERROR 0x454B4C4Cu   /* "LLKE" */

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static uint8_t *wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
    return p + 4;
}
static uint8_t *wr64(uint8_t *p, uint64_t v) { return wr32(wr32(p, (uint32_t)v), (uint32_t)(v >> 32)); }

static loom_status refuse(loom_status code, char *why, size_t cap, const char *msg) {
    snprintf(why, cap, "%s", msg);
    return code;
}

/* ------------------------------------------------------------ PREFILL */

size_t disagg_prefill_encode(uint8_t *buf, const loom_kv_info *me, const int32_t *tokens, int32_t n) {
    uint8_t *p = wr32(buf, MAGIC_PREFILL);
    p = wr32(p, DISAGG_PROTOCOL);
    p = wr32(p, (uint32_t)me->block_size);
    p = wr64(p, (uint64_t)me->block_bytes);
    p = wr32(p, (uint32_t)me->kv_dtype);
    p = wr32(p, (uint32_t)me->num_layers);
    p = wr32(p, (uint32_t)me->vocab);
    p = wr32(p, (uint32_t)n);
    for (int32_t i = 0; i < n; i++) p = wr32(p, (uint32_t)tokens[i]);
    return (size_t)(p - buf);
}

loom_status disagg_prefill_parse(const uint8_t *head, size_t len, const loom_kv_info *info, int32_t **tokens,
                                 int32_t *n, char *why, size_t cap) {
    *tokens = NULL;
    *n = 0;
    if (!head || len < DISAGG_PREFILL_FIXED || rd32(head) != MAGIC_PREFILL)
        return refuse(LOOM_ERR_FORMAT, why, cap, "not a prefill request");
    if (rd32(head + 4) != DISAGG_PROTOCOL) {
        snprintf(why, cap, "protocol %u, this engine speaks %d", rd32(head + 4), DISAGG_PROTOCOL);
        return LOOM_ERR_UNSUPPORTED;
    }
    uint32_t bs = rd32(head + 8), dt = rd32(head + 20), layers = rd32(head + 24), vocab = rd32(head + 28);
    uint64_t bb = rd64(head + 12);
    uint32_t count = rd32(head + 32);
    if (bs != (uint32_t)info->block_size || bb != (uint64_t)info->block_bytes || dt != (uint32_t)info->kv_dtype ||
        layers != (uint32_t)info->num_layers || vocab != (uint32_t)info->vocab) {
        snprintf(why, cap,
                 "engines differ: decode has block_size %u, block bytes %llu, KV dtype %s, %u layers, vocab %u; "
                 "prefill has %d, %zu, %s, %d, %d (same model, cache block_size and KV dtype on both)",
                 bs, (unsigned long long)bb, loom_dtype_name((loom_dtype)dt), layers, vocab, info->block_size,
                 info->block_bytes, loom_dtype_name(info->kv_dtype), info->num_layers, info->vocab);
        return LOOM_ERR_INVALID;
    }
    if (count < 2 || (len - DISAGG_PREFILL_FIXED) / 4 != count || (len - DISAGG_PREFILL_FIXED) % 4 != 0) {
        snprintf(why, cap, "a prompt of %u tokens in %zu bytes (want at least 2 tokens, 4 bytes each)", count, len);
        return LOOM_ERR_FORMAT;
    }
    if (count >= (uint32_t)info->max_model_len) {
        snprintf(why, cap,
                 "a prompt of %u tokens does not fit the prefill engine's context (engine.max_model_len %d: at most "
                 "%d prompt tokens); give the prefill server at least the decode server's max_model_len",
                 count, info->max_model_len, info->max_model_len - 1);
        return LOOM_ERR_FORMAT;
    }
    int32_t *t = malloc((size_t)count * sizeof *t);
    if (!t) return refuse(LOOM_ERR_NOMEM, why, cap, "out of memory");
    for (uint32_t i = 0; i < count; i++) {
        uint32_t v = rd32(head + DISAGG_PREFILL_FIXED + 4 * i);
        if (v >= vocab) {
            free(t);
            snprintf(why, cap, "token %u at position %u is outside the vocabulary [0, %u)", v, i, vocab);
            return LOOM_ERR_FORMAT;
        }
        t[i] = (int32_t)v;
    }
    *tokens = t;
    *n = (int32_t)count;
    return LOOM_OK;
}

/* ----------------------------------------------------------------- KV */

void disagg_kv_encode(uint8_t buf[DISAGG_KV_HEAD], int32_t num_tokens, int32_t block_size, int32_t num_blocks,
                      uint64_t block_bytes) {
    uint8_t *p = wr32(buf, MAGIC_KV);
    p = wr32(p, DISAGG_PROTOCOL);
    p = wr32(p, (uint32_t)num_tokens);
    p = wr32(p, (uint32_t)block_size);
    p = wr32(p, (uint32_t)num_blocks);
    wr64(p, block_bytes);
}

loom_status disagg_kv_parse(const uint8_t *head, size_t len, uint64_t payload_len, int32_t n,
                            const loom_kv_info *info, loom_kv_handoff *h, char *why, size_t cap) {
    if (!head || len != DISAGG_KV_HEAD || rd32(head) != MAGIC_KV || rd32(head + 4) != DISAGG_PROTOCOL)
        return refuse(LOOM_ERR_FORMAT, why, cap, "malformed KV message head");
    uint32_t nt = rd32(head + 8), bs = rd32(head + 12), nb = rd32(head + 16);
    uint64_t bb = rd64(head + 20);
    uint32_t want_nb = ((uint32_t)n - 1 + (uint32_t)info->block_size - 1) / (uint32_t)info->block_size;
    if (nt != (uint32_t)n - 1 || bs != (uint32_t)info->block_size || bb != (uint64_t)info->block_bytes ||
        nb != want_nb || payload_len != (uint64_t)nb * bb) {
        snprintf(why, cap,
                 "the KV message covers %u tokens in %u blocks of %u tokens / %llu bytes (payload %llu bytes); "
                 "asked for %d tokens in %u blocks of %d / %zu",
                 nt, nb, bs, (unsigned long long)bb, (unsigned long long)payload_len, n - 1, want_nb,
                 info->block_size, info->block_bytes);
        return LOOM_ERR_FORMAT;
    }
    *h = (loom_kv_handoff){.struct_size = sizeof *h, .num_tokens = (int32_t)nt, .block_size = (int32_t)bs,
                           .num_blocks = (int32_t)nb, .block_bytes = (size_t)bb};
    return LOOM_OK;
}

/* -------------------------------------------------------------- ERROR */

size_t disagg_error_encode(uint8_t *buf, loom_status code, const char *msg) {
    size_t l = msg ? strnlen(msg, DISAGG_ERROR_MAX) : 0;
    uint8_t *p = wr32(buf, MAGIC_ERROR);
    p = wr32(p, DISAGG_PROTOCOL);
    p = wr32(p, (uint32_t)code);
    memcpy(p, msg, l);
    return 12 + l;
}

bool disagg_error_parse(const uint8_t *head, size_t len, char *msg, size_t cap) {
    if (!head || len < 12 || len > 12 + DISAGG_ERROR_MAX || rd32(head) != MAGIC_ERROR || cap == 0) return false;
    size_t l = len - 12 < cap - 1 ? len - 12 : cap - 1;
    for (size_t i = 0; i < l; i++) {
        uint8_t c = head[12 + i];
        msg[i] = c >= 0x20 && c < 0x7F ? (char)c : '?';
    }
    msg[l] = 0;
    return true;
}
