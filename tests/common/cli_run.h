/*
 * tests/common/cli_run.h — run a program (the built `loom`) as a child
 * process from a Criterion test and capture what it printed: stdin from
 * /dev/null, stdout and stderr to files of a temporary folder, read back
 * whole. Shared by the cli, engine and quant CLI tests; test_slurp also
 * by tests that read a whole data file. Every helper fails the current
 * test on an error of its own (a file that cannot be read, fork failing).
 */
#ifndef LOOM_TEST_CLI_RUN_H
#define LOOM_TEST_CLI_RUN_H

#include <stddef.h>

typedef struct cli_out {
    int code;  /* exit status; -1 when killed by a signal */
    char *out; /* stdout */
    char *err; /* stderr */
    size_t out_len; /* bytes of stdout (it may hold NUL bytes) */
} cli_out;

/* NULL-terminated argument list for cli_run. */
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Run `bin` with the NULL-terminated `args` (may be NULL; at most 62), in
 * folder `cwd` (NULL: this one), with the NULL-terminated "NAME=VALUE"
 * entries of `env` (may be NULL) set on top of this environment. */
cli_out cli_run(const char *bin, const char *cwd, const char *const *env, const char *const *args);
void cli_out_free(cli_out *r);

/* The whole file, NUL-terminated (its length in *len when len is not
 * NULL); fails the test when it cannot be read. */
char *test_slurp(const char *path, size_t *len);

#endif
