/*
 * tests/common/tp_util.h — file-system helpers for loader, pipeline and CLI
 * tests: temporary directories, writing and copying files, joining paths.
 * Every function aborts the test process on failure (tests only).
 */
#ifndef LOOM_TEST_TP_UTIL_H
#define LOOM_TEST_TP_UTIL_H

#include <stdbool.h>

/* getenv that fails the test when unset. */
const char *tp_env(const char *name);
/* New empty directory under $TMPDIR (or /tmp); malloc'd path. */
char *tp_mkdtemp(void);
/* Remove a directory tree (quietly ignores a NULL path). */
void tp_rm_rf(const char *path);
/* "dir/name", malloc'd. */
char *tp_join(const char *dir, const char *name);
/* Write text to path (created/truncated). */
void tp_write(const char *path, const char *text);
/* printf into a file. */
void tp_writef(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Byte copy of src to dst (a new inode, unlike a link). */
void tp_copy(const char *src, const char *dst);
/* Whole file as a NUL-terminated malloc'd string. */
char *tp_read(const char *path);

#endif
