/*
 * tests/fuzz/fuzz_safetensors.c — a safetensors file and its config.json
 * in memory through the model loader (loom_model_load with opts.data and
 * opts.config_json): config parsing and range checks, the header, tensor
 * geometry, names, packed AWQ/GPTQ layers, the shape check against the
 * config.
 *
 * Input: u32 little-endian n, then n bytes of config.json, then the
 * .safetensors bytes. n = 0 uses a small valid Llama config, so most of
 * the effort goes to the header.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "model/model.h"

static const char k_config[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":8,\"hidden_size\":4,"
    "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
    "\"max_position_embeddings\":32,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"tie_word_embeddings\":true}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    if (size < 4) return 0;
    uint32_t n = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    data += 4, size -= 4;
    if (n > size) n = (uint32_t)size;
    loom_model_load_opts o = {.path = "fuzz.safetensors", .format = "safetensors", .data = data + n,
                              .size = size - n, .config_json = n ? (const char *)data : k_config,
                              .config_json_len = n ? n : sizeof k_config - 1};
    loom_model *m = NULL;
    loom_error err = {0};
    loom_status st = loom_model_load(&o, &m, &err);
    fuzz_note("model", &err);
    if (st == LOOM_OK) loom_model_free(m);
    else FUZZ_CHECK(m == NULL && err.message[0]);
    return 0;
}
