/*
 * cli/cmd_plugin_test.c — `loom plugin-test PATH.so`: run the conformance
 * kit (conformance/conformance.h, docs/plugin-test.md) against a plugin:
 * the loader's checks, then the contract tests of each component's kind,
 * one line per check (PASS / FAIL with why / SKIP for an optional
 * capability the plugin does not have) and a summary with the seed that
 * replays the run.
 *
 * Exit 0 when every check passed and every component could be tested, 1
 * otherwise (a failure, a refused file, a component of a kind the kit
 * cannot test), 2 on a usage error.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "conformance.h"
#include "plugin/registry.h"

static const char k_usage[] =
    "usage: loom plugin-test PLUGIN [--kind KIND] [--component NAME] [--check TEXT]\n"
    "                        [--seed S] [--quick] [--set KEY=VALUE]... [--no-fork]\n"
    "                        [--inner-backend NAME] [--vocab N] [--timeout S] [--verbose]\n"
    "\n"
    "Run the conformance kit against PLUGIN (a .so path, or the name of a component\n"
    "in the search path): the loader's checks, then the contract tests of each\n"
    "component's kind — cache managers and schedulers under random traffic (no\n"
    "leaked or double-freed block, budgets and caps, preemption, forks), samplers\n"
    "(ranges, logprobs, seeds, chi-square distributions, candidate rows), quantizers\n"
    "(round-trip error bounds, refusals), speculators, backends and executors on a\n"
    "tiny dummy model. Prints PASS/FAIL/SKIP per check and a summary; see\n"
    "docs/plugin-test.md for what each check holds a plugin to.\n"
    "\n"
    "options:\n"
    "  --kind KIND           only components of this kind (cache, scheduler, ...)\n"
    "  --component NAME      only the component with this name\n"
    "  --check TEXT          only checks whose name contains TEXT\n"
    "  --seed S              base seed (decimal or 0x hex); default LOOM_TEST_SEED or\n"
    "                        the clock. Printed in the summary: a failure replays with\n"
    "                        --seed S --check NAME\n"
    "  --quick               fewer iterations (about a fifth)\n"
    "  -s, --set KEY=VALUE   set a parameter of the component under test (repeatable;\n"
    "                        VALUE is YAML), e.g. --set pipeline=draft.yaml\n"
    "  --no-fork             run checks in this process (for a debugger; a crashing\n"
    "                        plugin then ends the run)\n"
    "  --inner-backend NAME  executors: the backend component to attach (default cpu)\n"
    "  --vocab N             speculators: vocabulary size (default 256, the tiny model)\n"
    "  --timeout S           seconds one check may take (default 300)\n"
    "  -v, --verbose         show the plugin's log lines\n"
    "  -h, --help            this text\n";

enum { OPT_KIND = 256, OPT_COMPONENT, OPT_CHECK, OPT_SEED, OPT_QUICK, OPT_NOFORK, OPT_INNER, OPT_VOCAB,
       OPT_TIMEOUT };

/* A component name instead of a path: the file that provides it (NULL
 * when no file in the search path has one by that name). */
static const char *resolve(const char *arg, loom_conformance_opts *o) {
    struct stat sb;
    if (stat(arg, &sb) == 0 || strchr(arg, '/') || strstr(arg, ".so")) return arg;
    loom_registry *reg = NULL;
    if (loom_registry_create(NULL, 0, NULL, LOOM_REGISTRY_DEFAULT, &reg, NULL) != LOOM_OK) return arg;
    int n = 0;
    const loom_registry_item *items = loom_registry_list(reg, &n);
    static char path[4096];
    const char *found = NULL;
    for (int i = 0; i < n && !found; i++)
        for (uint32_t k = 0; items[i].desc && k < items[i].desc->num_components; k++)
            if (!strcmp(items[i].desc->components[k].name, arg) &&
                (!o->kind || items[i].desc->components[k].kind == o->kind)) {
                snprintf(path, sizeof path, "%s", items[i].path);
                found = path;
                break;
            }
    loom_registry_destroy(reg);
    if (found && !o->component) o->component = arg;
    return found;
}

/* Parse the options into o (sets into `sets`); returns -1 to go on, else an exit code. */
static int parse(int argc, char **argv, loom_conformance_opts *o, const char **sets, const char **plugin) {
    static const struct option opts[] = {
        {"kind", required_argument, NULL, OPT_KIND},       {"component", required_argument, NULL, OPT_COMPONENT},
        {"check", required_argument, NULL, OPT_CHECK},     {"seed", required_argument, NULL, OPT_SEED},
        {"quick", no_argument, NULL, OPT_QUICK},           {"set", required_argument, NULL, 's'},
        {"no-fork", no_argument, NULL, OPT_NOFORK},        {"inner-backend", required_argument, NULL, OPT_INNER},
        {"vocab", required_argument, NULL, OPT_VOCAB},     {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"verbose", no_argument, NULL, 'v'},               {"help", no_argument, NULL, 'h'},
        {0},
    };
    long v;
    int ch;
    opterr = 0;
    optind = 0; /* glibc: full re-initialisation */
    while ((ch = getopt_long(argc, argv, ":s:vh", opts, NULL)) != -1) {
        switch (ch) {
        case OPT_KIND:
            if (!(o->kind = loom_kind_from_name(optarg)))
                return cli_usage_error("plugin-test", k_usage, "unknown kind '%s' (backend, executor, scheduler, "
                                       "cache, quantizer, sampler, speculator)", optarg);
            break;
        case OPT_COMPONENT: o->component = optarg; break;
        case OPT_CHECK: o->check = optarg; break;
        case OPT_SEED: {
            char *end;
            o->seed = strtoull(optarg, &end, 0);
            if (!*optarg || *end) return cli_usage_error("plugin-test", k_usage, "--seed: '%s' is not a number", optarg);
            break;
        }
        case OPT_QUICK: o->quick = true; break;
        case 's': sets[o->num_sets++] = optarg; break;
        case OPT_NOFORK: o->no_fork = true; break;
        case OPT_INNER: o->inner_backend = optarg; break;
        case OPT_VOCAB:
            if (!cli_parse_long("plugin-test", k_usage, "--vocab", optarg, 2, 1 << 24, &v)) return LOOM_EXIT_USAGE;
            o->spec_vocab = (int32_t)v;
            break;
        case OPT_TIMEOUT:
            if (!cli_parse_long("plugin-test", k_usage, "--timeout", optarg, 1, 86400, &v)) return LOOM_EXIT_USAGE;
            o->timeout_s = (int32_t)v;
            break;
        case 'v': o->verbose = true; break;
        case 'h': fputs(k_usage, stdout); return LOOM_EXIT_OK;
        default: {
            char msg[256];
            cli_bad_option(ch, argv, msg, sizeof msg);
            return cli_usage_error("plugin-test", k_usage, "%s", msg);
        }
        }
    }
    if (optind >= argc) return cli_usage_error("plugin-test", k_usage, "no plugin given");
    *plugin = argv[optind++];
    if (optind < argc)
        return cli_usage_error("plugin-test", k_usage, "unexpected argument '%s' (one PLUGIN only)", argv[optind]);
    return -1;
}

int loom_cmd_plugin_test(int argc, char **argv) {
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    if (!sets) {
        fprintf(stderr, "loom plugin-test: out of memory\n");
        return LOOM_EXIT_FAIL;
    }
    loom_conformance_opts o = {.out = stdout, .sets = sets};
    o.seed = loom_conformance_default_seed();
    const char *plugin = NULL;
    int rc = parse(argc, argv, &o, sets, &plugin);
    if (rc >= 0) {
        free(sets);
        return rc;
    }
    const char *file = resolve(plugin, &o);
    if (!file) {
        fprintf(stderr, "loom plugin-test: '%s' is neither a file nor the name of %s component in the search path "
                "(`loom plugins` lists them)\n", plugin, o.kind ? loom_kind_with_article(o.kind) : "a");
        free(sets);
        return LOOM_EXIT_FAIL;
    }
    plugin = file;
    loom_error err = {0};
    loom_status st = loom_conformance_run_file(plugin, &o, NULL, &err);
    if (st != LOOM_OK) fprintf(stderr, "loom plugin-test: %s: %s\n", plugin, err.message);
    free(sets);
    return st == LOOM_OK ? LOOM_EXIT_OK : LOOM_EXIT_FAIL;
}
