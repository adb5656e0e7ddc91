/*
 * cli/cmd_plugins.c — `loom plugins [--params] [--json]`: every plugin in
 * the search path with kind, name, version, ABI and file; broken files with
 * the loader's reason; with --params each component's parameter table (key,
 * type, default, bounds or choices, doc) — the config reference for any
 * plugin, generated from the plugin itself.
 *
 * Listing never stops at a broken file. Exit 0 when the listing ran (broken
 * files are reported, not fatal), 2 on a usage error.
 */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "pipeline/pipeline.h"
#include "plugin/registry.h"

static const char k_usage[] =
    "usage: loom plugins [--params] [--json]\n"
    "\n"
    "List every plugin loom can find: kind, name, version, plugin ABI and file,\n"
    "then any file that could not be loaded, with why.\n"
    "\n"
    "options:\n"
    "  --params   also print each component's parameters (key, type, default,\n"
    "             bounds or choices, doc): the keys its YAML section accepts\n"
    "  --json     machine-readable output\n"
    "  -h, --help this text\n"
    "\n"
    "Search path: LOOM_PLUGIN_PATH (colon-separated), then the build tree when run\n"
    "from it, otherwise <libdir>/loom/plugins. A pipeline's plugin_path comes\n"
    "first when loading a pipeline (see `loom check`).\n";

/* One component with the item it came from, for sorting. */
typedef struct row {
    const loom_component *c;
    const loom_registry_item *item;
} row;

static int row_cmp(const void *a, const void *b) {
    const row *x = a, *y = b;
    if (x->c->kind != y->c->kind) return (int)x->c->kind - (int)y->c->kind;
    int n = strcmp(x->c->name, y->c->name);
    return n ? n : strcmp(x->item->path, y->item->path);
}

static const char *type_name(loom_param_type t) {
    switch (t) {
    case LOOM_PARAM_BOOL: return "bool";
    case LOOM_PARAM_INT: return "int";
    case LOOM_PARAM_FLOAT: return "float";
    case LOOM_PARAM_STRING: return "string";
    case LOOM_PARAM_ENUM: return "enum";
    }
    return "?";
}

/* "[1, 1024]", "fcfs|priority" or "-". */
static void param_range(const loom_param *p, char *buf, size_t n) {
    buf[0] = '\0';
    if (p->type == LOOM_PARAM_ENUM) {
        size_t len = 0;
        for (int i = 0; p->choices && p->choices[i]; i++) {
            int w = snprintf(buf + len, n - len, "%s%s", i ? "|" : "", p->choices[i]);
            if (w < 0 || (size_t)w >= n - len) break;
            len += (size_t)w;
        }
    } else if ((p->type == LOOM_PARAM_INT || p->type == LOOM_PARAM_FLOAT) && p->min <= p->max) {
        snprintf(buf, n, "[%.15g, %.15g]", p->min, p->max);
    }
    if (!buf[0]) snprintf(buf, n, "-");
}

static void param_default(const loom_param *p, char *buf, size_t n) {
    if (!p->default_value) snprintf(buf, n, "(required)");
    else if (!p->default_value[0]) snprintf(buf, n, "\"\"");
    else snprintf(buf, n, "%s", p->default_value);
}

static void print_params_text(const loom_component *c) {
    const loom_param *ps = c->params;
    if (!ps || !ps[0].key) {
        printf("    (no parameters)\n");
        return;
    }
    int wk = 3, wt = 4, wd = 7, wr = 5;
    char def[LOOM_PARAM_STRING_MAX], range[512];
    for (const loom_param *p = ps; p->key; p++) {
        param_default(p, def, sizeof def);
        param_range(p, range, sizeof range);
        if ((int)strlen(p->key) > wk) wk = (int)strlen(p->key);
        if ((int)strlen(type_name(p->type)) > wt) wt = (int)strlen(type_name(p->type));
        if ((int)strlen(def) > wd) wd = (int)strlen(def);
        if ((int)strlen(range) > wr) wr = (int)strlen(range);
    }
    printf("    %-*s  %-*s  %-*s  %-*s  %s\n", wk, "KEY", wt, "TYPE", wd, "DEFAULT", wr, "RANGE",
           "DOC");
    for (const loom_param *p = ps; p->key; p++) {
        param_default(p, def, sizeof def);
        param_range(p, range, sizeof range);
        printf("    %-*s  %-*s  %-*s  %-*s  %s\n", wk, p->key, wt, type_name(p->type), wd, def, wr,
               range, p->doc ? p->doc : "");
    }
}

/* The loader's message without its leading "'<path>'" (printed above it). */
static const char *without_path(const char *error, const char *path) {
    size_t n = strlen(path);
    if (error[0] == '\'' && strncmp(error + 1, path, n) == 0 && error[n + 1] == '\'') {
        const char *rest = error + n + 2;
        if (rest[0] == ':') rest++;
        while (*rest == ' ') rest++;
        return rest;
    }
    return error;
}

static void print_text(loom_registry *reg, const loom_registry_item *items, int n, row *rows,
                       int nrows, bool params) {
    printf("plugin search path:\n");
    for (int i = 0; i < loom_registry_num_dirs(reg); i++) {
        const char *origin = NULL;
        bool exists = false;
        const char *d = loom_registry_dir(reg, i, &origin, &exists);
        printf("  %s (%s%s)\n", d, origin, exists ? "" : ", missing");
    }
    if (loom_registry_num_dirs(reg) == 0) printf("  (empty: set LOOM_PLUGIN_PATH)\n");
    printf("\n");
    if (params) {
        static const char *const core[][2] = {
            {"model", "what to load: a GGUF file, a safetensors directory or dummy weights"},
            {"engine", "the step loop itself: threads, context length, seeds, logging"}};
        for (int i = 0; i < 2; i++) {
            loom_component c = {.name = core[i][0], .params = loom_pipeline_section_params(core[i][0])};
            printf("%s (core) — %s\n", core[i][0], core[i][1]);
            print_params_text(&c);
            printf("\n");
        }
    }
    if (nrows == 0) {
        printf("no plugins found\n");
    } else if (!params) {
        int wk = 4, wn = 4, wv = 7;
        for (int i = 0; i < nrows; i++) {
            int l = (int)strlen(loom_kind_name(rows[i].c->kind));
            if (l > wk) wk = l;
            if ((int)strlen(rows[i].c->name) > wn) wn = (int)strlen(rows[i].c->name);
            const char *v = rows[i].item->desc->version ? rows[i].item->desc->version : "?";
            if ((int)strlen(v) > wv) wv = (int)strlen(v);
        }
        printf("%-*s  %-*s  %-*s  %-4s  %s\n", wk, "KIND", wn, "NAME", wv, "VERSION", "ABI", "FILE");
        for (int i = 0; i < nrows; i++) {
            const loom_plugin_desc *d = rows[i].item->desc;
            char abi[24];
            snprintf(abi, sizeof abi, "%u.%u", d->abi_major, d->abi_minor);
            printf("%-*s  %-*s  %-*s  %-4s  %s\n", wk, loom_kind_name(rows[i].c->kind), wn,
                   rows[i].c->name, wv, d->version ? d->version : "?", abi, rows[i].item->path);
        }
    } else {
        for (int i = 0; i < nrows; i++) {
            const loom_component *c = rows[i].c;
            const loom_plugin_desc *d = rows[i].item->desc;
            printf("%s%s %s — %s\n", i ? "\n" : "", loom_kind_name(c->kind), c->name,
                   c->summary ? c->summary : "");
            printf("    %s (plugin %s %s, ABI %u.%u)\n", rows[i].item->path, d->name,
                   d->version ? d->version : "?", d->abi_major, d->abi_minor);
            print_params_text(c);
        }
    }
    int broken = 0, problems = 0;
    for (int i = 0; i < n; i++) {
        if (!items[i].desc) broken++;
        else if (items[i].status != LOOM_OK) problems++;
    }
    if (broken) {
        printf("\nbroken plugin files (not loaded):\n");
        for (int i = 0; i < n; i++)
            if (!items[i].desc)
                printf("  %s\n      %s\n", items[i].path, without_path(items[i].error, items[i].path));
    }
    if (problems) {
        printf("\nproblems:\n");
        for (int i = 0; i < n; i++)
            if (items[i].desc && items[i].status != LOOM_OK)
                printf("  %s\n      %s\n", items[i].path, items[i].error);
    }
}

static cJSON *params_json(const loom_component *c) {
    cJSON *arr = cJSON_CreateArray();
    for (const loom_param *p = c->params; p && p->key; p++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "key", p->key);
        cJSON_AddStringToObject(o, "type", type_name(p->type));
        if (p->default_value) cJSON_AddStringToObject(o, "default", p->default_value);
        else cJSON_AddNullToObject(o, "default");
        cJSON_AddBoolToObject(o, "required", p->default_value == NULL);
        if ((p->type == LOOM_PARAM_INT || p->type == LOOM_PARAM_FLOAT) && p->min <= p->max) {
            cJSON_AddNumberToObject(o, "min", p->min);
            cJSON_AddNumberToObject(o, "max", p->max);
        }
        if (p->type == LOOM_PARAM_ENUM) {
            cJSON *ch = cJSON_AddArrayToObject(o, "choices");
            for (int i = 0; p->choices && p->choices[i]; i++)
                cJSON_AddItemToArray(ch, cJSON_CreateString(p->choices[i]));
        }
        cJSON_AddStringToObject(o, "doc", p->doc ? p->doc : "");
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

static int print_json(loom_registry *reg, const loom_registry_item *items, int n, bool params) {
    cJSON *root = cJSON_CreateObject();
    cJSON *sp = cJSON_AddArrayToObject(root, "search_path");
    for (int i = 0; i < loom_registry_num_dirs(reg); i++) {
        const char *origin = NULL;
        bool exists = false;
        const char *d = loom_registry_dir(reg, i, &origin, &exists);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", d);
        cJSON_AddStringToObject(o, "origin", origin);
        cJSON_AddBoolToObject(o, "exists", exists);
        cJSON_AddItemToArray(sp, o);
    }
    cJSON *plugins = cJSON_AddArrayToObject(root, "plugins");
    cJSON *broken = cJSON_AddArrayToObject(root, "broken");
    for (int i = 0; i < n; i++) {
        const loom_registry_item *it = &items[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", it->path);
        if (!it->desc) {
            cJSON_AddStringToObject(o, "error", it->error);
            cJSON_AddItemToArray(broken, o);
            continue;
        }
        const loom_plugin_desc *d = it->desc;
        char abi[24];
        snprintf(abi, sizeof abi, "%u.%u", d->abi_major, d->abi_minor);
        cJSON_AddStringToObject(o, "name", d->name);
        cJSON_AddStringToObject(o, "version", d->version ? d->version : "");
        cJSON_AddStringToObject(o, "abi", abi);
        if (it->status != LOOM_OK) cJSON_AddStringToObject(o, "error", it->error);
        cJSON *comps = cJSON_AddArrayToObject(o, "components");
        for (uint32_t k = 0; k < d->num_components; k++) {
            const loom_component *c = &d->components[k];
            cJSON *co = cJSON_CreateObject();
            cJSON_AddStringToObject(co, "kind", loom_kind_name(c->kind));
            cJSON_AddStringToObject(co, "name", c->name);
            cJSON_AddStringToObject(co, "summary", c->summary ? c->summary : "");
            if (params) cJSON_AddItemToObject(co, "params", params_json(c));
            cJSON_AddItemToArray(comps, co);
        }
        cJSON_AddItemToArray(plugins, o);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) {
        fprintf(stderr, "loom plugins: out of memory formatting JSON\n");
        return LOOM_EXIT_FAIL;
    }
    printf("%s\n", text);
    cJSON_free(text);
    return LOOM_EXIT_OK;
}

int loom_cmd_plugins(int argc, char **argv) {
    static const struct option opts[] = {
        {"params", no_argument, NULL, 'p'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    bool params = false, json = false;
    opterr = 0;
    optind = 0; /* glibc: full re-initialisation */
    int ch;
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case 'p': params = true; break;
        case 'j': json = true; break;
        case 'h': fputs(k_usage, stdout); return LOOM_EXIT_OK;
        default: {
            char msg[256];
            cli_bad_option(ch, argv, msg, sizeof msg);
            return cli_usage_error("plugins", k_usage, "%s", msg);
        }
        }
    }
    if (optind < argc)
        return cli_usage_error("plugins", k_usage, "unexpected argument '%s'", argv[optind]);

    loom_registry *reg = NULL;
    loom_error err = {0};
    if (loom_registry_create(NULL, 0, NULL, LOOM_REGISTRY_DEFAULT, &reg, &err) != LOOM_OK) {
        fprintf(stderr, "loom plugins: %s\n", err.message);
        return LOOM_EXIT_FAIL;
    }
    int n = 0;
    const loom_registry_item *items = loom_registry_list(reg, &n);
    int rc = LOOM_EXIT_OK;
    if (json) {
        rc = print_json(reg, items, n, params);
    } else {
        int nrows = 0;
        for (int i = 0; i < n; i++)
            if (items[i].desc) nrows += (int)items[i].desc->num_components;
        row *rows = calloc(nrows ? (size_t)nrows : 1, sizeof *rows);
        if (!rows) {
            fprintf(stderr, "loom plugins: out of memory\n");
            loom_registry_destroy(reg);
            return LOOM_EXIT_FAIL;
        }
        int r = 0;
        for (int i = 0; i < n; i++)
            for (uint32_t k = 0; items[i].desc && k < items[i].desc->num_components; k++)
                rows[r++] = (row){&items[i].desc->components[k], &items[i]};
        qsort(rows, (size_t)nrows, sizeof *rows, row_cmp);
        print_text(reg, items, n, rows, nrows, params);
        free(rows);
    }
    loom_registry_destroy(reg);
    return rc;
}
