/*
 * cli/cli_util.c — what every `loom` command shares: the version text and
 * usage-error reporting. Commands parse their own options with getopt_long
 * (opterr = 0, so every complaint comes from here and ends in usage).
 */
#include <getopt.h>
#include <stdarg.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "loom/plugin.h"
#include "loom_build_config.h"

void cli_print_version(FILE *f) {
    fprintf(f, "loom %s\n", LOOM_VERSION);
    fprintf(f, "plugin ABI %d.%d, build signature 0x%x (%u-bit pointers, tensor layout rev %d)\n",
            LOOM_ABI_MAJOR, LOOM_ABI_MINOR, (unsigned)LOOM_BUILD_SIGNATURE,
            (unsigned)(sizeof(void *) * 8), LOOM_TENSOR_LAYOUT_REV);
#if LOOM_HAVE_CUDA
    fprintf(f, "CUDA: yes (built with CUDA kernels and the cuda backend)\n");
#else
    fprintf(f, "CUDA: no (built without CUDA)\n");
#endif
}

int cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "loom%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    vfprintf(stderr, fmt, ap);
    fputs("\n\n", stderr);
    va_end(ap);
    if (usage) fputs(usage, stderr);
    return LOOM_EXIT_USAGE;
}

void cli_bad_option(int ret, char **argv, char *buf, size_t size) {
    /* getopt_long leaves the offending word at argv[optind - 1]. */
    const char *word = optind > 0 ? argv[optind - 1] : "?";
    if (ret == ':')
        snprintf(buf, size, "option '%s' needs a value", word);
    else if (optopt)
        snprintf(buf, size, "unknown option '-%c'", optopt);
    else
        snprintf(buf, size, "unknown option '%s'", word);
}

char *cli_read_text_file(const char *path, const char *what, char *why, size_t size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, size, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(why, size, "cannot size %s: %s", path, strerror(errno));
    } else if (!(buf = malloc((size_t)n + 1))) {
        snprintf(why, size, "out of memory for %ld bytes of %s", n, path);
    } else if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        snprintf(why, size, "cannot read %s: %s", path, strerror(errno));
        free(buf);
        buf = NULL;
    } else {
        buf[n] = 0;
        if (strlen(buf) != (size_t)n) {
            snprintf(why, size, "%s contains NUL bytes; %s needs a UTF-8 text file", path, what);
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

bool cli_parse_long(const char *cmd, const char *usage, const char *opt, const char *v, long lo, long hi,
                    long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        cli_usage_error(cmd, usage, "%s expects an integer in [%ld, %ld], got '%s'", opt, lo, hi, v);
        return false;
    }
    *out = x;
    return true;
}

void cli_progress_bar(int64_t done, int64_t total) {
    enum { W = 30 };
    int fill = total > 0 ? (int)(W * done / total) : W;
    char bar[W + 1];
    for (int i = 0; i < W; i++) bar[i] = i < fill ? '#' : '.';
    bar[W] = 0;
    fprintf(stderr, "\r[%s] ", bar);
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
