/*
 * core/disagg/wire.h — the messages a decode engine and a prefill engine
 * exchange over a kv_connector (loom/kv_connector.h): what each head holds,
 * its encoder, and its parser. The parsers are pure functions over bytes a
 * peer sent, checked field by field against the receiving engine: they are
 * what the randomized hostile-input test (tests/disagg) drives.
 *
 * Every head starts with a 4-byte magic and the protocol version; integers
 * are little-endian.
 *   PREFILL (decode -> prefill): what the decode engine is (block size,
 *     block-image bytes, KV dtype, layers, vocabulary) and the prompt's
 *     token ids (at least 2).
 *   KV (prefill -> decode): how many tokens the payload's blocks cover (the
 *     prompt but its last token), the block size, the number of blocks and
 *     the bytes of each; the payload is exactly num_blocks * block_bytes.
 *   ERROR (prefill -> decode): a status code and a message.
 */
#ifndef LOOM_CORE_DISAGG_WIRE_H
#define LOOM_CORE_DISAGG_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "loom/engine.h"

#define DISAGG_PROTOCOL 1
#define DISAGG_MSG_PREFILL 1u
#define DISAGG_MSG_KV 2u
#define DISAGG_MSG_ERROR 3u
#define DISAGG_PREFILL_FIXED 36 /* bytes of a PREFILL head before the tokens */
#define DISAGG_KV_HEAD 28
#define DISAGG_ERROR_MAX 480    /* message bytes an ERROR carries at most  */

/* PREFILL: into buf (DISAGG_PREFILL_FIXED + 4 * n bytes); returns its length. */
size_t disagg_prefill_encode(uint8_t *buf, const loom_kv_info *me, const int32_t *tokens, int32_t n);
/* Parse a PREFILL head against this engine (info): on success the tokens
 * (borrowed from head, possibly unaligned: copied into *tokens, malloc'd,
 * caller frees) and their count. On failure a status and why. */
loom_status disagg_prefill_parse(const uint8_t *head, size_t len, const loom_kv_info *info, int32_t **tokens,
                                 int32_t *n, char *why, size_t cap);

/* KV head (DISAGG_KV_HEAD bytes). */
void disagg_kv_encode(uint8_t buf[DISAGG_KV_HEAD], int32_t num_tokens, int32_t block_size, int32_t num_blocks,
                      uint64_t block_bytes);
/* Parse a KV head and its payload size against what was asked (prompt of
 * n tokens) and this engine's info; fills h (tokens and blocks left to the
 * caller). */
loom_status disagg_kv_parse(const uint8_t *head, size_t len, uint64_t payload_len, int32_t n,
                            const loom_kv_info *info, loom_kv_handoff *h, char *why, size_t cap);

/* ERROR: into buf (12 + DISAGG_ERROR_MAX bytes); returns its length. */
size_t disagg_error_encode(uint8_t *buf, loom_status code, const char *msg);
/* The message of an ERROR head, printable ASCII only (anything else '?'),
 * into msg (cap bytes); false for a malformed head. */
bool disagg_error_parse(const uint8_t *head, size_t len, char *msg, size_t cap);

#endif
