/* TensorBoard event files (dtrain/tensorboard.h): Event/Summary messages packed by protobuf-c
 * (generated at build time from tensorboard.proto, the public field numbers) in TFRecord frames.
 * CRC32C comes from the CPU's SSE4.2 crc32 instruction where the compiler targets it, else the
 * bitwise definition (polynomial 0x82F63B78, reflected); Debian has no C CRC32C library. */
#include "dtrain/tensorboard.h"
#include "run/tensorboard.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_SCALARS 32

struct dt_tb_writer {
    int fd;
    dt_status err; /* the first write error (sticky) */
    char path[4096];
};

uint32_t dt_crc32c(uint32_t crc, const void *p, size_t n) {
    const unsigned char *b = p;
    crc = ~crc;
#if defined(__SSE4_2__) && defined(__x86_64__)
    for (; n >= 8; n -= 8, b += 8) {
        uint64_t v;
        memcpy(&v, b, 8);
        crc = (uint32_t)__builtin_ia32_crc32di(crc, v);
    }
    for (; n; n--) crc = __builtin_ia32_crc32qi(crc, *b++);
#else
    for (; n; n--) {
        crc ^= *b++;
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1)));
    }
#endif
    return ~crc;
}

/* TFRecord's masked CRC: rotated right by 15 bits plus a constant. */
static uint32_t masked_crc(const void *p, size_t n) {
    uint32_t c = dt_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static dt_status write_all(dt_tb_writer *w, const void *p, size_t n) {
    const char *b = p;
    while (n) {
        ssize_t k = write(w->fd, b, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return w->err = dt_error(DT_EIO, "`tensorboard` %s: write failed: %s", w->path, strerror(errno));
        b += k, n -= (size_t)k;
    }
    return DT_OK;
}

/* One TFRecord: uint64 length, masked CRC of it, the data, masked CRC of the data (little-endian). */
static dt_status write_record(dt_tb_writer *w, const uint8_t *data, size_t n) {
    if (w->err) return w->err;
    uint8_t head[12];
    uint64_t len = n;
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)(len >> (8 * i));
    uint32_t c = masked_crc(head, 8), d = masked_crc(data, n);
    for (int i = 0; i < 4; i++) head[8 + i] = (uint8_t)(c >> (8 * i));
    uint8_t tail[4];
    for (int i = 0; i < 4; i++) tail[i] = (uint8_t)(d >> (8 * i));
    DT_TRY(write_all(w, head, sizeof head));
    DT_TRY(write_all(w, data, n));
    return write_all(w, tail, sizeof tail);
}

/* Packs ev and writes it as one record. */
static dt_status write_event(dt_tb_writer *w, const Dtrain__Tb__Event *ev) {
    size_t n = dtrain__tb__event__get_packed_size(ev);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return w->err = dt_error(DT_ENOMEM, "`tensorboard`: out of memory packing an event of %zu bytes", n);
    dtrain__tb__event__pack(ev, buf);
    dt_status s = write_record(w, buf, n);
    free(buf);
    return s;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* mkdir -p dir. */
static dt_status make_dirs(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return dt_error(DT_EINVAL, "`tensorboard` %.60s...: path too long", dir);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                return dt_error(DT_EIO, "`tensorboard` %s: cannot create %s: %s", dir, p, strerror(errno));
            *s = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_error(DT_EIO, "`tensorboard` %s: not a directory; give a directory for the event files", dir);
    return DT_OK;
}

dt_status dt_tb_writer_create(dt_tb_writer **out, const char *dir) {
    *out = NULL;
    if (!dir || !dir[0]) return dt_error(DT_EINVAL, "`tensorboard` needs a directory");
    DT_TRY(make_dirs(dir));
    dt_tb_writer *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ENOMEM, "`tensorboard`: out of memory");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d.dtrain", dir, (long long)time(NULL), host,
             (int)getpid());
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (w->fd < 0) {
        dt_status s = dt_error(DT_EIO, "`tensorboard`: cannot create %s: %s", w->path, strerror(errno));
        free(w);
        return s;
    }
    Dtrain__Tb__Event ev = DTRAIN__TB__EVENT__INIT;
    ev.wall_time = now_s();
    ev.what_case = DTRAIN__TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    dt_status s = write_event(w, &ev);
    if (s != DT_OK) {
        dt_tb_writer_destroy(w);
        return s;
    }
    *out = w;
    return DT_OK;
}

const char *dt_tb_writer_path(const dt_tb_writer *w) { return w->path; }

dt_status dt_tb_writer_scalars(dt_tb_writer *w, int64_t step, double wall_time, const char *const *tags,
                               const float *values, int n) {
    if (n < 0 || n > MAX_SCALARS)
        return dt_error(DT_EINVAL, "dt_tb_writer_scalars: %d scalars (0..%d)", n, MAX_SCALARS);
    Dtrain__Tb__SummaryValue vals[MAX_SCALARS], *ptrs[MAX_SCALARS];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(values[i])) continue;
        dtrain__tb__summary_value__init(&vals[k]);
        vals[k].tag = (char *)tags[i];
        vals[k].simple_value = values[i];
        ptrs[k] = &vals[k];
        k++;
    }
    Dtrain__Tb__Summary sum = DTRAIN__TB__SUMMARY__INIT;
    sum.n_value = (size_t)k;
    sum.value = ptrs;
    Dtrain__Tb__Event ev = DTRAIN__TB__EVENT__INIT;
    ev.wall_time = wall_time > 0 ? wall_time : now_s();
    ev.step = step;
    ev.what_case = DTRAIN__TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_event(w, &ev);
}

dt_status dt_tb_writer_epoch(dt_tb_writer *w, const dt_epoch_info *e) {
    static const char *const tags[] = {"loss/train", "loss/test",    "accuracy/test", "throughput/samples_per_s",
                                       "lr",         "time/epoch_s", "loss/val",      "accuracy/val"};
    const float v[] = {e->train_loss, e->test_loss,      e->test_acc, (float)e->samples_per_s,
                       e->lr,         (float)e->epoch_s, e->val_loss, e->val_acc};
    return dt_tb_writer_scalars(w, e->global_step, 0, tags, v, 8);
}

dt_status dt_tb_writer_step(dt_tb_writer *w, const dt_step_info *s) {
    static const char *const train[] = {"train/loss", "train/lr", "train/samples_per_s", "train/grad_norm"};
    static const char *const eval[] = {"eval/loss_test", "eval/accuracy_test", "eval/loss_val", "eval/accuracy_val"};
    if (s->kind == DT_STEP_TRAIN) {
        const float v[] = {s->train_loss, s->lr, (float)s->samples_per_s, s->grad_norm};
        return dt_tb_writer_scalars(w, s->step, 0, train, v, 4);
    }
    const float v[] = {s->test_loss, s->test_acc, s->val_loss, s->val_acc};
    return dt_tb_writer_scalars(w, s->step, 0, eval, v, 4);
}

dt_status dt_tb_writer_destroy(dt_tb_writer *w) {
    if (!w) return DT_OK;
    dt_status s = w->err;
    if (fsync(w->fd) != 0 && errno != EINVAL && s == DT_OK)
        s = dt_error(DT_EIO, "`tensorboard` %s: fsync failed: %s", w->path, strerror(errno));
    if (close(w->fd) != 0 && s == DT_OK)
        s = dt_error(DT_EIO, "`tensorboard` %s: close failed: %s", w->path, strerror(errno));
    free(w);
    return s;
}
