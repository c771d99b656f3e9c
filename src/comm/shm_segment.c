/* The shm transport's segment (layout in shm.h): its name "/dtrain-<job>", the slot geometry
 * rank 0 chooses from its environment (fragments and bytes per channel slot, direct slots and
 * their chunk) and writes into the header, the segment's creation by rank 0 (O_EXCL, mode 0600,
 * robust liveness mutexes) and its opening by the other ranks (magic, version, world size).
 * Attaching, liveness and waiting are in transport_shm.c. */
#include "comm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static size_t env_size(const char *name, size_t dflt, size_t lo, size_t hi) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    char *end;
    unsigned long long v = strtoull(e, &end, 10);
    if (*end == 'k' || *end == 'K') v <<= 10;
    else if (*end == 'm' || *end == 'M') v <<= 20;
    return v < lo ? lo : v > hi ? hi : (size_t)v;
}

dt_status dt_shm_job_name(char *out, size_t n, const char *job) {
    if (!job || !*job)
        return dt_error(DT_EINVAL, "shm transport needs a job id (DTRAIN_JOB_ID or dt_comm_config.job_id)");
    if (!dt_comm_job_id_valid(job))
        return dt_error(DT_EINVAL, "job id '%.40s%s' must be 1-%d characters of letters, digits, '_' and '.'", job,
                        strlen(job) > 40 ? "..." : "", DT_COMM_JOB_ID_MAX);
    snprintf(out, n, "/dtrain-%s", job);
    return DT_OK;
}

dt_status dt_comm_shm_cleanup(const char *job_id) {
    char name[256];
    DT_TRY(dt_shm_job_name(name, sizeof name, job_id));
    if (shm_unlink(name) != 0 && errno != ENOENT)
        return dt_error(DT_EIO, "cannot remove /dev/shm%s: %s", name, strerror(errno));
    return DT_OK;
}

/* Bytes per direct slot. Every rank maps and touches every rank's slots (it reads its peers'),
 * so the direct area, n ranks x slots x chunk, is resident in each rank of the communicator: the
 * default chunk (512 KiB) is cut so that the area stays within DTRAIN_SHM_DIRECT (default 4 MiB,
 * the two-rank size), and a rank's shared memory does not grow with the world size (4 ranks:
 * 256 KiB chunks, 8: 128 KiB). A DTRAIN_SHM_CHUNK that is set is taken as it is. */
static size_t direct_chunk(int n, uint32_t slots) {
    const char *e = getenv("DTRAIN_SHM_CHUNK");
    if (e && *e) return env_size("DTRAIN_SHM_CHUNK", 512 << 10, 16 << 10, 64 << 20);
    size_t area = env_size("DTRAIN_SHM_DIRECT", 4 << 20, 64 << 10, (size_t)1 << 30);
    size_t chunk = area / ((size_t)n * slots) / 4096 * 4096;
    return chunk > 512 << 10 ? 512 << 10 : chunk < 16 << 10 ? 16 << 10 : chunk;
}

/* geometry, chosen by rank 0 (from its environment) and read by everyone from the header */
static void layout(shm_header *h, int n) {
    h->slots[0] = n <= 8 ? 8 : 4;
    h->slot_bytes[0] = (uint32_t)align_up(env_size("DTRAIN_SHM_FRAG", n <= 16 ? 64 << 10 : 16 << 10, 4 << 10, 4 << 20),
                                          64);
    h->slots[1] = 4;
    h->slot_bytes[1] = n <= 16 ? 32 << 10 : 8 << 10;
    h->small_bytes = (uint32_t)env_size("DTRAIN_SHM_SMALL", 16 << 10, 0, 1 << 30);
    h->d_slots = 4;
    h->d_chunk = align_up(direct_chunk(n, h->d_slots), 4096);
    h->off_ranks = align_up(sizeof(shm_header), 4096);
    h->off_chans = align_up(h->off_ranks + (size_t)n * sizeof(shm_rank), 4096);
    for (int k = 0; k < SHM_KINDS; k++)
        h->chan_bytes[k] = align_up(sizeof(shm_chan) + h->slots[k] * (sizeof(shm_frag) + h->slot_bytes[k]), 4096);
    h->off_direct = h->off_chans + (size_t)n * (size_t)n * (h->chan_bytes[0] + h->chan_bytes[1]);
    h->total_bytes = h->off_direct + (size_t)n * h->d_slots * h->d_chunk;
}

dt_status dt_shm_segment_create(dt_shm *s) {
    int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return dt_error(DT_EIO,
                            "shared-memory segment /dev/shm%s already exists: another job uses id '%s' or a "
                            "crashed one left it; remove /dev/shm%s or use a new job id",
                            s->name, s->job, s->name);
        return dt_error(DT_EIO, "cannot create shared memory /dev/shm%s: %s", s->name, strerror(errno));
    }
    shm_header tmp = {0};
    layout(&tmp, s->n);
    if (ftruncate(fd, (off_t)tmp.total_bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(s->name);
        return dt_error(DT_EIO, "cannot size shared memory /dev/shm%s to %llu bytes: %s (is /dev/shm full?)", s->name,
                        (unsigned long long)tmp.total_bytes, strerror(e));
    }
    void *m = mmap(NULL, tmp.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(s->name);
        return dt_error(DT_EIO, "cannot map shared memory /dev/shm%s: %s", s->name, strerror(errno));
    }
    s->seg = m;
    s->seg_bytes = tmp.total_bytes;
    s->hdr = m;
    tmp.magic = SHM_MAGIC;
    tmp.version = SHM_VERSION;
    tmp.size = (uint32_t)s->n;
    memcpy(s->hdr, &tmp, sizeof tmp);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    for (int r = 0; r < s->n; r++) pthread_mutex_init(&shm_rank_at(s, r)->alive, &a);
    pthread_mutexattr_destroy(&a);
    atomic_store(&s->hdr->ready, 1);
    return DT_OK;
}

dt_status dt_shm_segment_open(dt_shm *s, double deadline) {
    double wait = 0.5;
    for (;;) {
        int fd = shm_open(s->name, O_RDWR, 0);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(shm_header)) {
                void *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                close(fd);
                if (m == MAP_FAILED) return dt_error(DT_EIO, "cannot map /dev/shm%s: %s", s->name, strerror(errno));
                s->seg = m;
                s->seg_bytes = (size_t)st.st_size;
                s->hdr = m;
                while (!atomic_load(&s->hdr->ready)) {
                    if (dt_now() > deadline)
                        return dt_error(DT_ETIMEDOUT, "rank 0 of job '%s' created /dev/shm%s but never initialised it",
                                        s->job, s->name);
                    dt_shm_sleep_ms(1);
                }
                shm_header *h = s->hdr;
                if (h->magic != SHM_MAGIC || h->version != SHM_VERSION || h->total_bytes != s->seg_bytes)
                    return dt_error(DT_EFORMAT, "/dev/shm%s is not a dtrain segment of this version; remove it",
                                    s->name);
                if ((int)h->size != s->n)
                    return dt_error(DT_EMISMATCH,
                                    "job '%s' has world size %u but rank %d was started with world size %d", s->job,
                                    h->size, s->me, s->n);
                return DT_OK;
            }
            close(fd);
        } else if (errno != ENOENT) {
            return dt_error(DT_EIO, "cannot open shared memory /dev/shm%s: %s", s->name, strerror(errno));
        }
        if (dt_now() > deadline)
            return dt_error(DT_ETIMEDOUT,
                            "rank %d timed out waiting for rank 0 to create the segment of job '%s' "
                            "(/dev/shm%s): is rank 0 running with the same DTRAIN_JOB_ID?",
                            s->me, s->job, s->name);
        dt_shm_sleep_ms(wait);
        if (wait < 5) wait *= 1.5;
    }
}
