/*
 * cli/commands.h — the `loom` subcommands and what they share.
 *
 * Adding a command `foo`:
 *   1. add   X(foo, "one-line summary")   to LOOM_COMMANDS below (the order
 *      here is the order in `loom --help`; foo_bar is typed `loom foo-bar`);
 *   2. write cli/cmd_foo.c defining  int loom_cmd_foo(int argc, char **argv)
 *      (argv[0] is "foo"; handle --help; return a LOOM_EXIT_* code);
 *   3. add 'foo' to `loom_commands` in cli/meson.build.
 * loom.c builds its dispatch table from the same list. A command that runs
 * a pipeline takes its --set list, engine and tokens from engine_setup.h.
 */
#ifndef LOOM_CLI_COMMANDS_H
#define LOOM_CLI_COMMANDS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define LOOM_COMMANDS(X)                                                                           \
    X(run, "generate text from a prompt with a pipeline")                                          \
    X(serve, "OpenAI-compatible HTTP server (completions, chat, streaming) over a pipeline")       \
    X(bench, "offline benchmark of a pipeline, or an A/B comparison of two")                       \
    X(plugins, "list every plugin in the search path (and broken files, with why)")                \
    X(check, "validate a pipeline file, load its plugins, print it resolved")                      \
    X(perplexity, "perplexity of a text file under a pipeline's model (compare quantizers)")    \
    X(calibrate, "record activation statistics of a text for SmoothQuant (int8 w8a8)")            \
    X(plugin_test, "run the conformance kit's contract tests against a plugin .so")

#define LOOM_DECLARE_COMMAND(name, summary) int loom_cmd_##name(int argc, char **argv);
LOOM_COMMANDS(LOOM_DECLARE_COMMAND)
#undef LOOM_DECLARE_COMMAND

/* Exit codes of every command. */
enum {
    LOOM_EXIT_OK = 0,    /* did what was asked                          */
    LOOM_EXIT_FAIL = 1,  /* ran, but the input is bad or something failed */
    LOOM_EXIT_USAGE = 2, /* unknown command/option or missing argument   */
};

/* ---- helpers in cli/cli_util.c ----------------------------------------- */

/* "loom 0.1.0" + ABI + CUDA lines, for --version. */
void cli_print_version(FILE *f);
/* Print "loom CMD: message" and the command's usage to stderr; returns
 * LOOM_EXIT_USAGE. */
int  cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Text for getopt_long's last complaint: `ret` is what it returned ('?'
 * unknown option, ':' missing value — use an optstring starting with ':'). */
void cli_bad_option(int ret, char **argv, char *buf, size_t size);
/* A whole text file, NUL-terminated (malloc'd), or NULL with the reason in
 * `why`; a file with NUL bytes is refused ("<what> needs a UTF-8 text file"). */
char *cli_read_text_file(const char *path, const char *what, char *why, size_t size);
/* Parse option `opt`'s value as an integer in [lo, hi]; on failure print a
 * usage error for command `cmd` and return false. */
bool cli_parse_long(const char *cmd, const char *usage, const char *opt, const char *v, long lo, long hi,
                    long *out);
/* "\r[#####.....] " — a 30-cell bar for done/total on stderr (the caller
 * prints the rest of the line and flushes). */
void cli_progress_bar(int64_t done, int64_t total);
/* Monotonic seconds. */
double cli_now(void);

#endif
