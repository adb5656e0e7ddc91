/*
 * conformance/runner.c — running the kit: open the plugin through the
 * registry, list each component's checks (common ones, then its kind's),
 * run every check in a forked child with a fresh counting host, and print
 * one line per check plus a summary.
 *
 * A child reports through a shared page: its result, and the breadcrumb
 * (cf_where) of the step it is on. A child that dies without a result —
 * a signal, a sanitizer's exit, the per-check alarm — is reported as
 * "crashed in" / "timed out in" that check, at that step. The parent never
 * calls into the plugin, so it survives whatever the plugin does.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cf_kit.h"
#include "plugin/registry.h"
#include "util/util.h"

#define CF_MAX_CHECKS 128

/* What a child leaves for its parent (MAP_SHARED). */
typedef struct cf_shared {
    volatile int done;   /* 1 once the result below is complete */
    bool failed, skipped;
    char why[CF_WHY_MAX];
    char note[CF_NOTE_MAX];
    char where[CF_WHERE_MAX];
} cf_shared;

static loom_registry *g_registry;
static loom_plugin *g_plugin;

loom_registry *cf_registry(void) {
    if (!g_registry) loom_registry_create(NULL, 0, NULL, LOOM_REGISTRY_DEFAULT, &g_registry, NULL);
    return g_registry;
}

loom_plugin *cf_plugin(void) { return g_plugin; }

uint64_t loom_conformance_default_seed(void) {
    const char *s = getenv("LOOM_TEST_SEED");
    if (s && *s) return strtoull(s, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    cf_rng g = cf_rng_make((uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 20);
    return cf_rng_next(&g) >> 16; /* short enough to type */
}

/* ------------------------------------------------------------ one check */

static void run_inline(cf_run *r, const cf_check *ck, cf_shared *sh) {
    cf_host_reset(r->opts->verbose);
    r->where = sh->where;
    bool ok = ck->fn(r, ck->arg);
    if (!ok && !r->failed && !r->skipped) cf_fail(r, "the check returned false without a reason (a kit bug)");
    const char *bad = cf_host_violation();
    if (!r->failed && bad) cf_fail(r, "%s", bad);
    sh->failed = r->failed;
    sh->skipped = r->skipped && !r->failed;
    snprintf(sh->why, sizeof sh->why, "%s", r->why);
    snprintf(sh->note, sizeof sh->note, "%s", r->note);
    sh->done = 1;
}

/* Describe how a child ended without a result. */
static void describe_death(int status, int timeout, const cf_shared *sh, char *buf, size_t cap) {
    char at[CF_WHERE_MAX + 16] = "";
    if (sh->where[0]) snprintf(at, sizeof at, " (at %s)", sh->where);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        snprintf(buf, cap, "timed out after %d s%s: a plugin call never returned", timeout, at);
    else if (WIFSIGNALED(status))
        snprintf(buf, cap, "crashed: %s%s", strsignal(WTERMSIG(status)), at);
    else if (WIFEXITED(status))
        snprintf(buf, cap, "crashed: the check's process exited with status %d without a result%s "
                 "(a sanitizer report or the plugin's own message above says why)", WEXITSTATUS(status), at);
    else
        snprintf(buf, cap, "crashed%s", at);
}

static void run_forked(cf_run *r, const cf_check *ck, cf_shared *sh) {
    int timeout = r->opts->timeout_s > 0 ? r->opts->timeout_s : 300;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(sh->why, sizeof sh->why, "fork failed: %s", strerror(errno));
        sh->failed = true;
        sh->done = 1;
        return;
    }
    if (pid == 0) {
        signal(SIGALRM, SIG_DFL);
        alarm((unsigned)timeout);
        run_inline(r, ck, sh);
        fflush(NULL);
        _exit(0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (sh->done) return;
    describe_death(status, timeout, sh, sh->why, sizeof sh->why);
    sh->failed = true;
}

static bool matches(const loom_conformance_opts *o, const char *name) {
    return !o->check || !*o->check || strstr(name, o->check);
}

/* Run and print one check; updates sum. */
static void run_check(const loom_conformance_opts *o, const loom_component *c, const char *path,
                      const cf_check *ck, cf_shared *sh, loom_conformance_summary *sum) {
    FILE *out = o->out ? o->out : stdout;
    memset(sh, 0, sizeof *sh);
    cf_run r = {.opts = o, .comp = c, .path = path, .check = ck->name,
                .seed = cf_seed_mix(o->seed, ck->name), .quick = o->quick};
    if (o->no_fork) run_inline(&r, ck, sh);
    else run_forked(&r, ck, sh);
    const char *label = loom_kind_name(c->kind);
    if (sh->failed) {
        sum->failed++;
        fprintf(out, "FAIL  %s %s: %s: %s\n", label, c->name, ck->name, sh->why);
    } else if (sh->skipped) {
        sum->skipped++;
        fprintf(out, "SKIP  %s %s: %s: %s\n", label, c->name, ck->name, sh->why);
    } else {
        sum->passed++;
        fprintf(out, "PASS  %s %s: %s%s%s\n", label, c->name, ck->name, sh->note[0] ? ": " : "", sh->note);
    }
    fflush(out);
}

/* The checks of c: the common ones, then its kind's (*untested when the
 * kit has none for that kind). */
static int list_checks(const loom_component *c, cf_check *out, int cap, bool *untested) {
    int n = cf_checks_common(c, out, cap), k;
    switch (c->kind) {
    case LOOM_KIND_CACHE: k = cf_checks_cache(c, out + n, cap - n); break;
    case LOOM_KIND_SCHEDULER: k = cf_checks_scheduler(c, out + n, cap - n); break;
    case LOOM_KIND_SAMPLER: k = cf_checks_sampler(c, out + n, cap - n); break;
    case LOOM_KIND_QUANTIZER: k = cf_checks_quantizer(c, out + n, cap - n); break;
    case LOOM_KIND_SPECULATOR: k = cf_checks_speculator(c, out + n, cap - n); break;
    case LOOM_KIND_BACKEND: k = cf_checks_backend(c, out + n, cap - n); break;
    case LOOM_KIND_EXECUTOR: k = cf_checks_executor(c, out + n, cap - n); break;
    case LOOM_KIND_CONSTRAINT: k = cf_checks_constraint(c, out + n, cap - n); break;
    case LOOM_KIND_KV_CONNECTOR: k = cf_checks_kv_connector(c, out + n, cap - n); break;
    default: k = -1; break;
    }
    *untested = k < 0;
    return k < 0 ? n : n + k;
}

/* ------------------------------------------------------------ components */

static bool selected(const loom_conformance_opts *o, const loom_component *c) {
    if (o->kind && c->kind != o->kind) return false;
    return !o->component || !*o->component || !strcmp(o->component, c->name);
}

/* Run c's checks that match the filters; returns how many matched (an
 * untested component counts as one: it is reported). */
static int run_one_component(const loom_component *c, const char *path, const loom_conformance_opts *o,
                             cf_shared *sh, loom_conformance_summary *sum) {
    FILE *out = o->out ? o->out : stdout;
    cf_check *checks = calloc(CF_MAX_CHECKS, sizeof *checks);
    bool untested = false;
    int n = checks ? list_checks(c, checks, CF_MAX_CHECKS, &untested) : 0, ran = untested;
    for (int i = 0; i < n; i++)
        if (matches(o, checks[i].name)) {
            run_check(o, c, path, &checks[i], sh, sum);
            ran++;
        }
    if (untested) {
        sum->untested++;
        fprintf(out, "UNTESTED  %s %s: the kit has no checks for %s components yet\n",
                loom_kind_name(c->kind) ? loom_kind_name(c->kind) : "?", c->name,
                loom_kind_name(c->kind) ? loom_kind_name(c->kind) : "this kind of");
    }
    free(checks);
    return ran;
}

static void print_summary(const loom_conformance_opts *o, const char *what, const loom_conformance_summary *s) {
    FILE *out = o->out ? o->out : stdout;
    fprintf(out, "loom plugin-test %s: %d passed, %d failed, %d skipped", what, s->passed, s->failed, s->skipped);
    if (s->untested) fprintf(out, ", %d component%s untested", s->untested, s->untested == 1 ? "" : "s");
    fprintf(out, " (seed 0x%llx", (unsigned long long)o->seed);
    if (s->failed && s->passed + s->skipped) /* checks ran: one of them can be replayed */
        fprintf(out, "; replay a check with --seed 0x%llx --check NAME", (unsigned long long)o->seed);
    fprintf(out, ")\n");
    fflush(out);
}

/* ran: checks that matched the filters (selected components only). */
static loom_status result_of(const loom_conformance_opts *o, const loom_conformance_summary *s, int components,
                             int ran, loom_error *err) {
    if (!components) return loom_error_set(err, LOOM_ERR_NOT_FOUND, "no component matched the filters");
    if (!ran && o->check && *o->check)
        return loom_error_set(err, LOOM_ERR_NOT_FOUND,
                              "no check of the selected component%s has a name containing '%s' (--check)",
                              components == 1 ? "" : "s", o->check);
    if (!ran) return loom_error_set(err, LOOM_ERR_NOT_FOUND, "no check matched the filters");
    if (s->failed) return loom_error_set(err, LOOM_ERR_INVALID, "%d check%s failed", s->failed, s->failed == 1 ? "" : "s");
    if (s->untested)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED, "%d component%s could not be tested", s->untested,
                              s->untested == 1 ? "" : "s");
    if (!s->passed)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED, "every check was skipped: nothing was verified here");
    return LOOM_OK;
}

static cf_shared *shared_page(loom_error *err) {
    void *p = mmap(NULL, sizeof(cf_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        loom_error_set(err, LOOM_ERR_NOMEM, "mmap of the kit's result page failed: %s", strerror(errno));
        return NULL;
    }
    return p;
}

loom_status loom_conformance_run_component(const loom_component *comp, const char *path,
                                           const loom_conformance_opts *o, loom_conformance_summary *sum,
                                           loom_error *err) {
    loom_conformance_summary local = {0};
    if (!sum) sum = &local;
    memset(sum, 0, sizeof *sum);
    cf_shared *sh = shared_page(err);
    if (!sh) return LOOM_ERR_NOMEM;
    int ran = 0, components = 0;
    if (selected(o, comp)) {
        ran = run_one_component(comp, path, o, sh, sum);
        components = 1;
    }
    munmap(sh, sizeof *sh);
    print_summary(o, comp->name, sum);
    return result_of(o, sum, components, ran, err);
}

loom_status loom_conformance_run_file(const char *path, const loom_conformance_opts *o,
                                      loom_conformance_summary *sum, loom_error *err) {
    loom_conformance_summary local = {0};
    if (!sum) sum = &local;
    memset(sum, 0, sizeof *sum);
    FILE *out = o->out ? o->out : stdout;
    loom_registry *reg = cf_registry();
    if (!reg) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory creating the plugin registry");
    loom_error lerr = {0};
    loom_status st = loom_registry_open(reg, path, &g_plugin, &lerr);
    if (st != LOOM_OK) {
        sum->failed++;
        fprintf(out, "FAIL  %s: load: the loader refuses it: %s\n", path, lerr.message);
        print_summary(o, path, sum);
        return loom_error_set(err, st, "%s", lerr.message);
    }
    cf_shared *sh = shared_page(err);
    if (!sh) return LOOM_ERR_NOMEM;
    const loom_plugin_desc *d = loom_plugin_desc_of(g_plugin);
    fprintf(out, "plugin %s %s (%s): %u component%s\n", d->name, d->version ? d->version : "?",
            loom_plugin_path(g_plugin), d->num_components, d->num_components == 1 ? "" : "s");
    int ran = 0, components = 0;
    for (uint32_t i = 0; i < d->num_components; i++) {
        const loom_component *c = &d->components[i];
        if (!selected(o, c)) continue;
        ran += run_one_component(c, loom_plugin_path(g_plugin), o, sh, sum);
        components++;
    }
    munmap(sh, sizeof *sh);
    print_summary(o, path, sum);
    g_plugin = NULL;
    return result_of(o, sum, components, ran, err);
}
