/*
 * plugins/kv_connector/shm/payload_posix.c — `shm`'s payloads: a fresh
 * POSIX shared-memory segment per payload, "/loom-kv-<pid>-<n>-<random>"
 * (O_EXCL, mode 0600), mapped read-only by the peer and unlinked by the
 * sender once the peer acknowledged it, so no segment outlives a hand-over
 * unless the sending process dies in that window.
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "payload.h"

#define SEG_PREFIX "/loom-kv-"

static atomic_uint seg_counter;

typedef struct seg_map {
    void *p;
    size_t len;
} seg_map;

loom_status pay_available(int32_t device, loom_error *err) { return LOOM_OK; }

loom_status pay_put(int32_t device, const void *payload, int32_t payload_device, uint64_t len, void **lent,
                    uint8_t where[KVC_SHM_NAME], void **token, loom_error *err) {
    char *name = (char *)where;
    *token = NULL;
    if (payload_device >= 0)
        return kvc_fail(err, LOOM_ERR_UNSUPPORTED,
                        "kv_connector shm: the payload is device memory (CUDA device %d); shm sends host memory, "
                        "cuda-ipc sends device memory", (int)payload_device);
    uint32_t rnd = 0;
    RAND_bytes((unsigned char *)&rnd, sizeof rnd);
    memset(name, 0, KVC_SHM_NAME);
    snprintf(name, KVC_SHM_NAME, SEG_PREFIX "%d-%u-%08x", (int)getpid(), atomic_fetch_add(&seg_counter, 1), rnd);
    *token = NULL;
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return kvc_fail(err, LOOM_ERR_IO, "kv_connector shm: shm_open(%s): %s", name, strerror(errno));
    void *m = MAP_FAILED;
    int e = 0;
    if (ftruncate(fd, (off_t)len) != 0 || (m = mmap(NULL, (size_t)len, PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(name);
        return kvc_fail(err, e == ENOSPC || e == ENOMEM ? LOOM_ERR_NOMEM : LOOM_ERR_IO,
                        "kv_connector shm: a segment of %llu bytes: %s (is /dev/shm large enough?)",
                        (unsigned long long)len, strerror(e));
    }
    memcpy(m, payload, (size_t)len);
    munmap(m, (size_t)len);
    return LOOM_OK;
}

/* the peer's mapping, if any, outlives the name */
void pay_release(void *token, const uint8_t where[KVC_SHM_NAME], pay_outcome how) { shm_unlink((const char *)where); }

/* A segment name from a peer: ours in shape, NUL-terminated. */
static bool name_ok(const char *n) {
    size_t l = strnlen(n, KVC_SHM_NAME);
    if (l == KVC_SHM_NAME || strncmp(n, SEG_PREFIX, strlen(SEG_PREFIX)) != 0) return false;
    for (size_t i = 1; i < l; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'z') || n[i] == '-')) return false;
    return true;
}

loom_status pay_open(int32_t device, const uint8_t where[KVC_SHM_NAME], uint64_t len, const void **ptr,
                     int32_t *ptr_device, void **token, loom_error *err) {
    char name[KVC_SHM_NAME];
    *ptr_device = -1;
    memcpy(name, where, KVC_SHM_NAME);
    *token = NULL;
    if (!name_ok(name))
        return kvc_fail(err, LOOM_ERR_FORMAT, "kv_connector shm: peer named a segment that is not a loom KV segment");
    seg_map *s = malloc(sizeof *s);
    if (!s) return kvc_fail(err, LOOM_ERR_NOMEM, "kv_connector shm: out of memory");
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) {
        free(s);
        return kvc_fail(err, LOOM_ERR_IO, "kv_connector shm: shm_open(%s): %s", name, strerror(errno));
    }
    struct stat sb;
    void *m = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == len) m = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        free(s);
        return kvc_fail(err, LOOM_ERR_FORMAT, "kv_connector shm: segment %s is not the %llu bytes announced", name,
                        (unsigned long long)len);
    }
    *s = (seg_map){m, (size_t)len};
    *ptr = m;
    *token = s;
    return LOOM_OK;
}

loom_status pay_to_host(void *token, void *dst, uint64_t len, loom_error *err) {
    const seg_map *s = token;
    if (!s || len != s->len)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector shm: no received payload of %llu bytes to copy",
                        (unsigned long long)len);
    memcpy(dst, s->p, s->len);
    return LOOM_OK;
}

void pay_close(void *token) {
    seg_map *s = token;
    if (!s) return;
    munmap(s->p, s->len);
    free(s);
}
