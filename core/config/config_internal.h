/*
 * core/config/config_internal.h — the node layout and tree helpers shared by
 * the files of core/config (tree, load, bind). Not part of the contract in
 * config.h: nothing outside core/config includes this.
 *
 * Ownership: every node owns its children, its scalar text, its keys and a
 * private heap copy of each mark's file name (so a subtree can move between
 * trees, e.g. when an included file is merged, without dangling names).
 */
#ifndef LOOM_CORE_CONFIG_INTERNAL_H
#define LOOM_CORE_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

/* One entry of a map (key set) or a sequence (key NULL). */
typedef struct loom_cfg_item {
    char *key;              /* owned; NULL in a sequence                  */
    loom_cfg_mark key_mark; /* where the key was written; file owned      */
    loom_cfg_node *value;   /* owned; never NULL in a finished tree       */
} loom_cfg_item;

struct loom_cfg_node {
    loom_cfg_type type;   /* see loom_cfg_type                           */
    loom_cfg_mark mark;   /* start of the node; file owned               */
    char *text;           /* SCALAR: text as written; NULL: "~"/"null"/"" as written */
    int style;            /* yaml_scalar_style_t of a SCALAR as written; 0 = any */
    int count;            /* MAP/SEQ: items in use                       */
    int capacity;         /* MAP/SEQ: items allocated                    */
    loom_cfg_item *items; /* MAP/SEQ: owned array                        */
    int32_t *index;       /* MAP of 16+ keys: hash slots holding item indices
                           * (-1 empty), kept by append/remove; else NULL  */
    uint32_t index_mask;  /* slots - 1                                   */
};

/* The file name used in marks of values given with --set. */
#define LOOM_CFG_CMDLINE_FILE "<command line>"

/* New empty node of type t at mark m (copied; m may be NULL). NULL on OOM. */
loom_cfg_node *loom_cfg__node_new(loom_cfg_type t, const loom_cfg_mark *m);
/* Copy a mark, duplicating its file name. false on OOM (dst then has no file). */
bool loom_cfg__mark_copy(loom_cfg_mark *dst, const loom_cfg_mark *src);
void loom_cfg__mark_release(loom_cfg_mark *m);
/* Append an item; the key is copied, `value` is taken over only on success. */
bool loom_cfg__append(loom_cfg_node *n, const char *key, const loom_cfg_mark *key_mark,
                      loom_cfg_node *value);
/* Index of `key` in map n, -1 when absent. */
int loom_cfg__find(const loom_cfg_node *n, const char *key);
/* Remove and free item i of n. */
void loom_cfg__remove(loom_cfg_node *n, int i);
/* Deep copy; NULL on OOM. */
loom_cfg_node *loom_cfg__clone(const loom_cfg_node *n);
/* Number of nodes in the subtree (for the alias-expansion budget). */
size_t loom_cfg__count_nodes(const loom_cfg_node *n);
/* Deep-merge `src` into `dst` (both maps): maps merge key by key, anything
 * else replaces. Consumes src in every case. false on OOM (dst stays a valid
 * tree, possibly half merged). */
bool loom_cfg__merge(loom_cfg_node *dst, loom_cfg_node *src);
/* "a map", "a list", "null", or the scalar quoted and shortened. */
void loom_cfg__describe(const loom_cfg_node *n, char *buf, size_t size);
/* True for the plain-scalar spellings of null in YAML 1.2 core schema. */
bool loom_cfg__is_null_text(const char *s);

#endif
