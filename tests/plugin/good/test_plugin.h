/*
 * tests/plugin/good/test_plugin.h — the config struct every good test plugin
 * declares (one parameter of each type), shared with the tests that read
 * bound configs back.
 */
#ifndef LOOM_TEST_PLUGIN_H
#define LOOM_TEST_PLUGIN_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/plugin.h"

typedef struct tp_config {
    int64_t size;                       /* INT in [1, 1024], default 8      */
    double ratio;                       /* FLOAT in [0, 1], default 0.5     */
    bool verbose;                       /* BOOL, default false              */
    char label[LOOM_PARAM_STRING_MAX];  /* STRING, default "none"           */
    int64_t policy;                     /* ENUM fcfs|priority|random        */
    bool fail;                          /* create() fails when true         */
} tp_config;

#endif
