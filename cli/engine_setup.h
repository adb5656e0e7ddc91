/*
 * cli/engine_setup.h — what the commands that run a pipeline share: the
 * --set overrides of a command line, building the engine with one form of
 * error message, tokenizing with one, and for the commands that read a text
 * file (perplexity, calibrate) their common options and arguments. Each
 * command keeps its own options and output; this is the part they had
 * written out each.
 */
#ifndef LOOM_CLI_ENGINE_SETUP_H
#define LOOM_CLI_ENGINE_SETUP_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

#include "loom/engine.h"

/* ---- overrides ---------------------------------------------------------- */

/* The --set KEY=VALUE words of one command line, in order. */
typedef struct cli_sets {
    const char **v;      /* [argc + 1]: room for every word of argv; the strings are argv's */
    int n;
} cli_sets;

/* false when out of memory; each command reports that its own way. */
bool cli_sets_init(cli_sets *s, int argc);
void cli_sets_add(cli_sets *s, const char *assignment);
void cli_sets_free(cli_sets *s);

/* ---- the engine --------------------------------------------------------- */

/* The engine of pipeline file `config` with the overrides applied; NULL after
 * printing "loom CMD: [CONTEXT: ]why" on stderr (context may be NULL).
 * *seconds (may be NULL): how long building it took. Caller destroys. */
loom_engine *cli_engine_open(const char *cmd, const char *context, const char *config, const cli_sets *sets,
                             double *seconds);
/* Tokenize `text` (read from `path`), with the model's BOS when `bos`; false
 * after printing "loom CMD: tokenizing PATH: why". *ids is malloc'd. */
bool cli_engine_tokenize(const char *cmd, loom_engine *eng, const char *text, const char *path, bool bos,
                         int32_t **ids, int32_t *n);
/* Tokens per forward pass: `window` when given, else min(context, 1024). */
long cli_window_or_default(long window, int32_t context);

/* ---- commands over a text file ------------------------------------------ */

/* The options and arguments `loom perplexity` and `loom calibrate` share. */
typedef struct cli_text_args {
    const char *cmd;           /* the command, for messages                  */
    const char *usage;         /* its usage text                             */
    cli_sets sets;             /* -s, --set KEY=VALUE (repeatable)           */
    long window;               /* -w, --window N; 0 = cli_window_or_default  */
    long max_tokens;           /* -n, --max-tokens N; 0 = all                */
    bool bos;                  /* false with --no-bos                        */
    bool quiet;                /* -q, --quiet: no progress bar               */
    const char *config, *path; /* CONFIG TEXTFILE                            */
} cli_text_args;

/* The shared options, for a command's getopt_long table and optstring. */
#define CLI_TEXT_LONG_OPTIONS                                                                  \
    {"window", required_argument, NULL, 'w'}, {"max-tokens", required_argument, NULL, 'n'},   \
    {"no-bos", no_argument, NULL, 'B'}, {"set", required_argument, NULL, 's'},                \
    {"quiet", no_argument, NULL, 'q'}, {"help", no_argument, NULL, 'h'}
#define CLI_TEXT_OPTSTRING "w:n:s:qh"

/* What cli_text_option made of one getopt_long result. */
typedef enum cli_opt {
    CLI_OPT_TAKEN,   /* a shared option, recorded in the args                   */
    CLI_OPT_HELP,    /* --help: the usage is printed on stdout; exit 0           */
    CLI_OPT_USAGE,   /* an unknown option or a bad value, reported; exit 2       */
} cli_opt;

/* Start a command's option parsing: defaults, and getopt reset (opterr 0:
 * every complaint comes from cli_util). false when out of memory. */
bool cli_text_args_init(cli_text_args *a, const char *cmd, const char *usage, int argc);
void cli_text_args_free(cli_text_args *a);
/* Take getopt_long's result `ch` once the command has handled its own letters. */
cli_opt cli_text_option(cli_text_args *a, int ch, char **argv);
/* After the options exactly CONFIG and TEXTFILE remain; false after a usage
 * error. */
bool cli_text_positionals(cli_text_args *a, int argc, char **argv);
/* TEXTFILE's contents (malloc'd), or NULL after "loom CMD: why"; `what`
 * names the use in the message about NUL bytes ("calibration"). */
char *cli_text_read(const cli_text_args *a, const char *what);

#endif
