/*
 * cli/cmd_check.c — `loom check CONFIG [--set KEY=VALUE]...`: load a
 * pipeline exactly as `loom run` would up to (not including) loading the
 * model: includes, overrides, every key checked, every plugin found, loaded
 * (the loader's ABI and REQUIRED-method checks) and its section bound, then
 * every plugin created and destroyed again, so a create() that refuses its
 * configuration (or finds no device) shows here. Prints the resolved
 * pipeline (defaults filled in, each plugin's file in a comment) as YAML on
 * stdout, or every problem as "file:line:col: error: message" on stderr.
 *
 * Exit 0 valid, 1 invalid, 2 usage error.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "commands.h"
#include "engine_setup.h"
#include "config/config.h"
#include "pipeline/pipeline.h"
#include "plugin/host.h"
#include "plugin/registry.h"

static const char k_usage[] =
    "usage: loom check CONFIG [--set KEY=VALUE]... [--quiet]\n"
    "\n"
    "Validate the pipeline file CONFIG: parse it (with includes), apply the\n"
    "overrides, check every key, find and load every plugin, bind its section,\n"
    "and create (then destroy) every plugin instance.\n"
    "On success print the resolved pipeline as YAML (every parameter, defaults\n"
    "included, each plugin's file in a comment); otherwise print every problem\n"
    "as file:line:col and exit 1.\n"
    "\n"
    "options:\n"
    "  -s, --set KEY=VALUE  override a key, e.g. --set scheduler.max_num_seqs=64\n"
    "                       (repeatable; VALUE is YAML: 64, true, [1, 2], null)\n"
    "  -q, --quiet          print nothing on success\n"
    "  -h, --help           this text\n";

/* Create and destroy every slot's instance; each failure is printed like a
 * config error at its section. Returns how many failed. */
static int create_all(const loom_pipeline *p) {
    int failed = 0;
    for (int i = 0; i < loom_pipeline_num_slots(p); i++) {
        const loom_pipeline_slot *slot = loom_pipeline_slot_at(p, i);
        void *self = NULL;
        loom_error err = {0};
        if (loom_pipeline_create_instance(slot, loom_host_default(), &self, &err) == LOOM_OK) {
            loom_pipeline_destroy_instance(slot, self);
            continue;
        }
        char where[LOOM_ERROR_MSG_MAX];
        loom_cfg_mark_format(&slot->mark, where, sizeof where);
        fprintf(stderr, "%s%serror: %s\n", where, where[0] ? ": " : "", err.message);
        failed++;
    }
    return failed;
}

int loom_cmd_check(int argc, char **argv) {
    static const struct option opts[] = {
        {"set", required_argument, NULL, 's'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    cli_sets overrides;
    if (!cli_sets_init(&overrides, argc)) {
        fprintf(stderr, "loom check: out of memory\n");
        return LOOM_EXIT_FAIL;
    }
    int rc = LOOM_EXIT_OK;
    bool quiet = false;
    const char *config = NULL;
    opterr = 0;
    optind = 0; /* glibc: full re-initialisation */
    int ch;
    while ((ch = getopt_long(argc, argv, ":s:qh", opts, NULL)) != -1) {
        switch (ch) {
        case 's': cli_sets_add(&overrides, optarg); break;
        case 'q': quiet = true; break;
        case 'h':
            fputs(k_usage, stdout);
            goto done;
        default: {
            char msg[256];
            cli_bad_option(ch, argv, msg, sizeof msg);
            rc = cli_usage_error("check", k_usage, "%s", msg);
            goto done;
        }
        }
    }
    if (optind >= argc) {
        rc = cli_usage_error("check", k_usage, "no pipeline file given");
        goto done;
    }
    config = argv[optind++];
    if (optind < argc) {
        rc = cli_usage_error("check", k_usage, "unexpected argument '%s' (one CONFIG only)",
                             argv[optind]);
        goto done;
    }

    loom_diag diag;
    loom_diag_init(&diag);
    loom_pipeline *p = NULL;
    if (loom_pipeline_load(config, overrides.v, overrides.n, &p, &diag) != LOOM_OK) {
        loom_diag_print(&diag, stderr);
        fprintf(stderr, "loom check: %s: %d error%s\n", config, diag.count,
                diag.count == 1 ? "" : "s");
        rc = LOOM_EXIT_FAIL;
    } else {
        int failed = create_all(p);
        if (failed) {
            fprintf(stderr, "loom check: %s: %d plugin%s could not be created\n", config, failed,
                    failed == 1 ? "" : "s");
            rc = LOOM_EXIT_FAIL;
        } else if (!quiet) {
            loom_pipeline_print(p, stdout);
        }
        loom_pipeline_destroy(p);
    }
    loom_diag_free(&diag);
done:
    cli_sets_free(&overrides);
    return rc;
}
