/*
 * cli/cli_util.c — what every `loom` command shares: the version text and
 * usage-error reporting. Commands parse their own options with getopt_long
 * (opterr = 0, so every complaint comes from here and ends in usage).
 */
#include <getopt.h>
#include <stdarg.h>
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
