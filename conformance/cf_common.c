/*
 * conformance/cf_common.c — the checks every component gets, whatever its
 * kind (loom/plugin.h's rules for all of them):
 *
 *   params       every parameter has a doc line and a default (or is
 *                required and given with --set); the defaults bind.
 *   create       create() with the defaults succeeds, through the registry
 *                when the plugin was opened from a file (instance count
 *                back to 0 after destroy); destroy() returns every host
 *                allocation; destroy(NULL) is a no-op.
 *   create.nomem each host allocation create() makes is made to fail in
 *                turn: create() must not crash, must fail with
 *                LOOM_ERR_NOMEM and a message, and must leave nothing
 *                behind ("succeeds fully or leaves nothing behind").
 */
#include <stdlib.h>
#include <string.h>

#include "cf_kit.h"
#include "plugin/registry.h"

#define CF_NOMEM_POINTS 48

static bool check_params(cf_run *r, const void *arg) {
    (void)arg;
    const loom_component *c = r->comp;
    int n = 0;
    for (const loom_param *p = c->params; p && p->key; p++, n++) {
        CF_ENSURE(r, p->doc && *p->doc, "parameter '%s' has no doc line (`loom plugins --params` shows it)",
                  p->key);
        if (p->default_value) continue;
        bool given = false;
        for (int i = 0; i < r->opts->num_sets; i++)
            given |= !strncmp(r->opts->sets[i], p->key, strlen(p->key)) && r->opts->sets[i][strlen(p->key)] == '=';
        CF_ENSURE(r, given, "parameter '%s' is required (no default): run with --set %s=VALUE", p->key, p->key);
    }
    char why[LOOM_ERROR_MSG_MAX];
    void *cfg = cf_config(r, "", why, sizeof why);
    CF_ENSURE(r, cfg, "the declared defaults do not bind: %s", why);
    free(cfg);
    cf_note(r, "%d parameter%s", n, n == 1 ? "" : "s");
    return true;
}

/* Through loom_plugin_create_instance: the loader's own bookkeeping. */
static bool create_via_registry(cf_run *r) {
    struct loom_plugin *p = cf_plugin();
    char why[LOOM_ERROR_MSG_MAX];
    void *cfg = cf_config(r, "", why, sizeof why);
    CF_ENSURE(r, cfg, "the declared defaults do not bind: %s", why);
    void *self = NULL;
    loom_error err = {0};
    cf_where(r, "create() through the registry");
    loom_status st = loom_plugin_create_instance(p, r->comp, cf_host(), cfg, &self, &err);
    free(cfg);
    if (st == LOOM_ERR_DEVICE) {
        cf_skip(r, "create() found no usable device: %s", err.message);
        return false;
    }
    CF_ENSURE(r, st == LOOM_OK, "%s", err.message);
    CF_ENSURE(r, self, "create() returned LOOM_OK but left *self NULL");
    CF_ENSURE(r, loom_plugin_live_instances(p) == 1, "the registry counts %d live instances, want 1",
              loom_plugin_live_instances(p));
    cf_where(r, "destroy() through the registry");
    loom_plugin_destroy_instance(p, r->comp, self);
    CF_ENSURE(r, loom_plugin_live_instances(p) == 0, "the registry counts %d live instances after destroy",
              loom_plugin_live_instances(p));
    long live = cf_host_live();
    CF_ENSURE(r, live == 0, "destroy() left %ld host allocation%s unfreed", live, live == 1 ? "" : "s");
    return true;
}

static bool check_create(cf_run *r, const void *arg) {
    (void)arg;
    if (cf_plugin() && !create_via_registry(r)) return false;
    void *self;
    for (int i = 0; i < 2; i++) { /* twice: no state left over between instances */
        if (!cf_create(r, "", &self)) return false;
        if (!cf_destroy(r, self)) return false;
    }
    const loom_ops_head *ops = r->comp->ops;
    cf_where(r, "destroy(NULL)");
    ops->destroy(NULL);
    return true;
}

static bool check_create_nomem(cf_run *r, const void *arg) {
    (void)arg;
    char why[LOOM_ERROR_MSG_MAX];
    void *cfg = cf_config(r, "", why, sizeof why);
    CF_ENSURE(r, cfg, "the declared defaults do not bind: %s", why);
    const loom_ops_head *ops = r->comp->ops;
    int points = 0;
    bool ok = true;
    for (long k = 0; k < CF_NOMEM_POINTS && ok; k++) {
        void *self = NULL;
        loom_error err = {0};
        cf_host_fail_alloc(k);
        cf_where(r, "create() with host allocation #%ld failing", k + 1);
        loom_status st = ops->create(cf_host(), cfg, &self, &err);
        long calls = cf_host_alloc_calls();
        cf_host_fail_alloc(-1);
        if (calls <= k) { /* create made fewer allocations: every point was tried */
            if (st == LOOM_OK) ops->destroy(self);
            break;
        }
        points++;
        if (st == LOOM_OK) {
            ok = cf_fail(r, "create() returned LOOM_OK although host allocation #%ld failed", k + 1);
            ops->destroy(self);
            break;
        }
        long live = cf_host_live();
        if (live) ok = cf_fail(r, "create() failed (allocation #%ld refused) but left %ld host allocation%s behind",
                               k + 1, live, live == 1 ? "" : "s");
        else if (st != LOOM_ERR_NOMEM)
            ok = cf_fail(r, "create() answered a refused allocation (#%ld) with status %d, not LOOM_ERR_NOMEM (%s)",
                         k + 1, (int)st, err.message);
        else if (!err.message[0])
            ok = cf_fail(r, "create() failed on refused allocation #%ld without a message", k + 1);
    }
    free(cfg);
    if (ok) cf_note(r, "%d allocation point%s", points, points == 1 ? "" : "s");
    return ok;
}

int cf_checks_common(const loom_component *c, cf_check *out, int cap) {
    (void)c;
    int n = 0;
    n = cf_add(out, n, cap, check_params, NULL, "params");
    n = cf_add(out, n, cap, check_create, NULL, "create");
    n = cf_add(out, n, cap, check_create_nomem, NULL, "create.nomem");
    return n;
}
