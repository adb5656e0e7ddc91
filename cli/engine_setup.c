/*
 * cli/engine_setup.c — building and feeding an engine from the command line
 * (see engine_setup.h): overrides, the engine with its error message,
 * tokenizing, and the options of the commands that score a text file.
 */
#include "engine_setup.h"

#include <stdio.h>
#include <stdlib.h>

#include "commands.h"

bool cli_sets_init(cli_sets *s, int argc) {
    s->n = 0;
    s->v = calloc((size_t)argc + 1, sizeof *s->v);
    return s->v != NULL;
}

void cli_sets_add(cli_sets *s, const char *assignment) { s->v[s->n++] = assignment; }

void cli_sets_free(cli_sets *s) {
    free(s->v);
    s->v = NULL;
    s->n = 0;
}

loom_engine *cli_engine_open(const char *cmd, const char *context, const char *config, const cli_sets *sets,
                             double *seconds) {
    loom_engine *eng = NULL;
    loom_error err = {0};
    double t0 = cli_now();
    if (loom_engine_create(config, sets->v, sets->n, &eng, &err) != LOOM_OK) {
        fprintf(stderr, "loom %s: %s%s%s\n", cmd, context ? context : "", context ? ": " : "", err.message);
        return NULL;
    }
    if (seconds) *seconds = cli_now() - t0;
    return eng;
}

bool cli_engine_tokenize(const char *cmd, loom_engine *eng, const char *text, const char *path, bool bos,
                         int32_t **ids, int32_t *n) {
    loom_error err = {0};
    if (loom_engine_tokenize(eng, text, bos, ids, n, &err) == LOOM_OK) return true;
    fprintf(stderr, "loom %s: tokenizing %s: %s\n", cmd, path, err.message);
    return false;
}

long cli_window_or_default(long window, int32_t context) {
    if (window != 0) return window;
    return context < 1024 ? context : 1024;
}

bool cli_text_args_init(cli_text_args *a, const char *cmd, const char *usage, int argc) {
    *a = (cli_text_args){.cmd = cmd, .usage = usage, .bos = true};
    opterr = 0;
    optind = 0; /* glibc: full re-initialisation */
    return cli_sets_init(&a->sets, argc);
}

void cli_text_args_free(cli_text_args *a) { cli_sets_free(&a->sets); }

cli_opt cli_text_option(cli_text_args *a, int ch, char **argv) {
    switch (ch) {
    case 'w':
        return cli_parse_long(a->cmd, a->usage, "--window", optarg, 2, 1L << 24, &a->window) ? CLI_OPT_TAKEN
                                                                                             : CLI_OPT_USAGE;
    case 'n':
        return cli_parse_long(a->cmd, a->usage, "--max-tokens", optarg, 2, 1L << 30, &a->max_tokens)
                   ? CLI_OPT_TAKEN
                   : CLI_OPT_USAGE;
    case 'B': a->bos = false; return CLI_OPT_TAKEN;
    case 's': cli_sets_add(&a->sets, optarg); return CLI_OPT_TAKEN;
    case 'q': a->quiet = true; return CLI_OPT_TAKEN;
    case 'h': fputs(a->usage, stdout); return CLI_OPT_HELP;
    default: {
        char msg[256];
        cli_bad_option(ch, argv, msg, sizeof msg);
        cli_usage_error(a->cmd, a->usage, "%s", msg);
        return CLI_OPT_USAGE;
    }
    }
}

bool cli_text_positionals(cli_text_args *a, int argc, char **argv) {
    if (argc - optind != 2) {
        cli_usage_error(a->cmd, a->usage, "expected CONFIG and TEXTFILE, got %d argument%s", argc - optind,
                        argc - optind == 1 ? "" : "s");
        return false;
    }
    a->config = argv[optind];
    a->path = argv[optind + 1];
    return true;
}

char *cli_text_read(const cli_text_args *a, const char *what) {
    char why[512];
    char *text = cli_read_text_file(a->path, what, why, sizeof why);
    if (!text) fprintf(stderr, "loom %s: %s\n", a->cmd, why);
    return text;
}
