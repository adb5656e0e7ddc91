/*
 * cli/loom.c — the `loom` command: global options and dispatch to one
 * function per subcommand (cli/cmd_<name>.c). The table is generated from
 * LOOM_COMMANDS in commands.h, so a new command is one line there, one file
 * and one word in cli/meson.build. A '_' in a command's C name is a '-' on
 * the command line (plugin_test is `loom plugin-test`).
 *
 * Exit codes: 0 ok, 1 the command failed (bad config, broken plugin, ...),
 * 2 usage error (unknown command or option), each with a message on stderr.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"

typedef struct loom_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} loom_command;

#define LOOM_COMMAND_ENTRY(name, summary) {#name, loom_cmd_##name, summary},
static const loom_command k_commands[] = {LOOM_COMMANDS(LOOM_COMMAND_ENTRY)};
#undef LOOM_COMMAND_ENTRY
#define NUM_COMMANDS ((int)(sizeof k_commands / sizeof k_commands[0]))

/* The command's name as typed: its C name with '_' written '-'. */
static const char *spelled(const char *name) {
    static char buf[64];
    snprintf(buf, sizeof buf, "%s", name);
    for (char *p = buf; *p; p++)
        if (*p == '_') *p = '-';
    return buf;
}

static void usage(FILE *f) {
    fprintf(f, "usage: loom [--help] [--version] COMMAND [ARGS...]\n\ncommands:\n");
    for (int i = 0; i < NUM_COMMANDS; i++)
        fprintf(f, "  %-11s %s\n", spelled(k_commands[i].name), k_commands[i].summary);
    fprintf(f,
            "\nRun `loom COMMAND --help` for a command's options.\n"
            "\nenvironment:\n"
            "  LOOM_PLUGIN_PATH       extra plugin directories (colon-separated), searched\n"
            "                         after a pipeline's plugin_path\n"
            "  LOOM_PLUGIN_PATH_ONLY  1 = search only plugin_path and LOOM_PLUGIN_PATH\n"
            "\nlogging: --set engine.log_level=debug|info|warn|error (default warn)\n");
}

static const loom_command *lookup(const char *name) {
    for (int i = 0; i < NUM_COMMANDS; i++)
        if (strcmp(spelled(k_commands[i].name), name) == 0) return &k_commands[i];
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "loom: no command given\n\n");
        usage(stderr);
        return LOOM_EXIT_USAGE;
    }
    const char *first = argv[1];
    if (strcmp(first, "--help") == 0 || strcmp(first, "-h") == 0) {
        usage(stdout);
        return LOOM_EXIT_OK;
    }
    if (strcmp(first, "--version") == 0 || strcmp(first, "-V") == 0) {
        cli_print_version(stdout);
        return LOOM_EXIT_OK;
    }
    /* `loom help` and `loom help COMMAND` read naturally; forward them. */
    if (strcmp(first, "help") == 0) {
        if (argc < 3) {
            usage(stdout);
            return LOOM_EXIT_OK;
        }
        const loom_command *c = lookup(argv[2]);
        if (!c) {
            fprintf(stderr, "loom: unknown command '%s'\n\n", argv[2]);
            usage(stderr);
            return LOOM_EXIT_USAGE;
        }
        char *help_argv[] = {argv[2], "--help", NULL};
        return c->run(2, help_argv);
    }
    if (first[0] == '-') {
        fprintf(stderr, "loom: unknown option '%s'\n\n", first);
        usage(stderr);
        return LOOM_EXIT_USAGE;
    }
    const loom_command *c = lookup(first);
    if (!c) {
        fprintf(stderr, "loom: unknown command '%s'\n\n", first);
        usage(stderr);
        return LOOM_EXIT_USAGE;
    }
    return c->run(argc - 1, argv + 1);
}
