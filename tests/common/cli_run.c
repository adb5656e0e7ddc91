/*
 * tests/common/cli_run.c — see cli_run.h.
 */
#include "cli_run.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

char *test_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cr_assert(b);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

/* In the child: the environment, the folder and the three descriptors,
 * then exec; exit status 127 when any of it fails. */
static void child(const char *bin, const char *cwd, const char *const *env,
                  const char *const *args, const char *out, const char *err) {
    for (const char *const *e = env; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq) _exit(127);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
        setenv(name, eq + 1, 1);
    }
    int fi = open("/dev/null", O_RDONLY);
    int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fi < 0 || fo < 0 || fe < 0 || (cwd && chdir(cwd) != 0)) _exit(127);
    dup2(fi, 0);
    dup2(fo, 1);
    dup2(fe, 2);
    char *argv[64] = {(char *)bin};
    int n = 1;
    for (; args && args[n - 1] && n < 63; n++) argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    execv(bin, argv);
    _exit(127);
}

cli_out cli_run(const char *bin, const char *cwd, const char *const *env, const char *const *args) {
    cr_assert(bin && bin[0], "no program to run (run through meson test)");
    char dir[] = "/tmp/loom-test-cli-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char out[64], err[64];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(err, sizeof err, "%s/err", dir);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) child(bin, cwd, env, args, out, err);
    int status = 0;
    waitpid(pid, &status, 0);
    size_t out_len = 0;
    char *o = test_slurp(out, &out_len);
    cli_out r = {WIFEXITED(status) ? WEXITSTATUS(status) : -1, o, test_slurp(err, NULL), out_len};
    unlink(out);
    unlink(err);
    rmdir(dir);
    return r;
}

void cli_out_free(cli_out *r) {
    free(r->out);
    free(r->err);
}
