/*
 * conformance/cf_pending.c — kinds the kit has no checks for yet: their
 * components are reported UNTESTED (never a silent pass).
 */
#include "cf_kit.h"

int cf_checks_sampler(const loom_component *c, cf_check *out, int cap) { return -1; }
int cf_checks_quantizer(const loom_component *c, cf_check *out, int cap) { return -1; }
int cf_checks_speculator(const loom_component *c, cf_check *out, int cap) { return -1; }
int cf_checks_backend(const loom_component *c, cf_check *out, int cap) { return -1; }
int cf_checks_executor(const loom_component *c, cf_check *out, int cap) { return -1; }
