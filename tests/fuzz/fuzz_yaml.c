/*
 * tests/fuzz/fuzz_yaml.c — the YAML pipeline loader on arbitrary bytes
 * (loom_cfg_load_buffer, includes off: no file is read), then what
 * `loom check` does with a tree: print it, re-parse the print, apply a
 * --set override. Any crash, leak, sanitizer report or a tree whose print
 * does not parse back is a finding.
 */
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "fuzz_util.h"

/* The tree printed as YAML must parse back (config.h promises it). */
static void reprint(const loom_cfg_node *root) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return;
    loom_cfg_print(root, f);
    fclose(f);
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *again = loom_cfg_load_buffer(text, len, "printed.yaml", NULL, &d);
    if (!again) {
        loom_diag_print(&d, stderr);
        fprintf(stderr, "printed tree:\n%s\n", text);
    }
    FUZZ_CHECK(again != NULL);
    loom_cfg_free(again);
    loom_diag_free(&d);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    loom_diag d;
    loom_diag_init(&d);
    loom_cfg_node *root = loom_cfg_load_buffer((const char *)data, size, "fuzz.yaml", NULL, &d);
    if (root) {
        FUZZ_CHECK(d.count == 0);
        reprint(root);
        loom_cfg_set_override(root, "engine.max_model_len=64", 1, &d);
        (void)loom_cfg_get_path(root, "model.path");
        loom_cfg_free(root);
    } else {
        FUZZ_CHECK(d.count > 0); /* a refusal always says why */
    }
    loom_diag_free(&d);
    return 0;
}
