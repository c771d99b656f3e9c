/* Sharded checkpoints (DCP style). Every rank of a sharded strategy (ZeRO) writes the pieces of
 * the training state it owns to "<path>.rR-of-N": one 1-d F32 tensor "<tensor>#<offset>" per
 * piece, with the tensor's global shape in the metadata ("dtrain.shape.<tensor>"). Once every
 * shard is durable, rank 0 writes the index <path> itself: the usual checkpoint metadata plus
 * "dtrain.shards" = N and no tensors. The index is written last, so a checkpoint exists only
 * when all of its shards do; once it is in place, the shards of an earlier save under the same
 * path with another number of ranks are removed (dt_ckpt_remove_stale_shards). Loading reads every
 * shard into whole tensors, so a checkpoint resumes at any world size and ZeRO stage, or without
 * ZeRO; `dtrain ckpt consolidate` writes it as one file. */
#include "run/checkpoint.h"

#include "core/sys.h"
#include "device/device.h"

#include "dtrain/dtrain.h"
#include "dtrain/safetensors.h"
#include "parallel/strategy.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/random.h>
#include <unistd.h>

#define SHARD_KIND "dtrain-train-shard"

void dt_ckpt_shard_path(char *out, size_t cap, const char *path, int r, int n) {
    snprintf(out, cap, "%s.r%d-of-%d", path, r, n);
}

void dt_ckpt_remove_stale_shards(const char *path, int n) {
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    char dir[4096];
    if (dt_path_dir(dir, sizeof dir, path) >= sizeof dir) return;
    DIR *d = opendir(dir);
    if (!d) return; /* nothing to tidy that can be seen */
    const size_t len = strlen(base);
    for (struct dirent *e; (e = readdir(d));) {
        int r, k, used = 0;
        if (strncmp(e->d_name, base, len) != 0 || sscanf(e->d_name + len, ".r%d-of-%d%n", &r, &k, &used) != 2 ||
            e->d_name[len + (size_t)used] != 0 || (k == n && r >= 0 && r < n))
            continue;
        char full[8192];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        unlink(full);
    }
    closedir(d);
}

typedef struct {
    dt_st_writer *w;
    int pieces;
    dt_dev *dev;  /* the state's device when the host cannot read it (NULL: host memory) */
    float **copy; /* dev: each piece's host copy, held until the shard is written */
    int ncopy, cap;
} shard_ctx;

/* The host copy of device piece p (downloaded), kept in c until the shard is written. */
static dt_status piece_copy(shard_ctx *c, const dt_state_piece *p, const float **out) {
    if (c->ncopy == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        float **t = realloc(c->copy, sizeof *t * (size_t)cap);
        if (!t) return dt_error(DT_ENOMEM, "checkpoint: out of memory");
        c->copy = t, c->cap = cap;
    }
    float *h = malloc(p->buf.count * sizeof(float));
    if (!h)
        return dt_error(DT_ENOMEM, "checkpoint: out of memory for a host copy of '%s' (%zu values)", p->name,
                        p->buf.count);
    c->dev->ops->download(c->dev, h, p->buf.data, p->buf.count * sizeof(float));
    c->copy[c->ncopy++] = h;
    *out = h;
    return DT_OK;
}

static dt_status add_shard_piece(void *ctx, const dt_state_piece *p) {
    shard_ctx *c = ctx;
    if (p->buf.dtype != DT_F32 || p->buf.device != DT_DEVICE_CPU)
        return dt_error(DT_ENOTSUP, "checkpoint: tensor '%s' is not f32 host memory", p->name);
    if (p->offset + p->buf.count > p->numel)
        return dt_error(DT_EINTERNAL, "checkpoint: piece [%zu, %zu) of '%s' exceeds its %zu elements", p->offset,
                        p->offset + p->buf.count, p->name, p->numel);
    if (p->buf.count == 0) return DT_OK;
    char name[160], key[192], shape[96];
    snprintf(name, sizeof name, "%s#%zu", p->name, p->offset);
    const int64_t n = (int64_t)p->buf.count;
    const float *data = p->buf.data;
    if (c->dev) DT_TRY(piece_copy(c, p, &data));
    DT_TRY(dt_st_writer_add(c->w, name, DT_F32, 1, &n, data));
    size_t k = 0;
    for (int d = 0; d < p->ndim && k < sizeof shape; d++)
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%" PRId64, d ? "," : "", p->shape[d]);
    if (p->ndim == 0) snprintf(shape, sizeof shape, "scalar");
    snprintf(key, sizeof key, "dtrain.shape.%s", name);
    c->pieces++;
    return dt_st_writer_meta(c->w, key, shape);
}

/* This rank's shard file. */
static dt_status write_shard(const char *path, dt_strategy *s, const dt_ckpt_info *info, int r, int n,
                             const char *save_id) {
    dt_dev *dev = dt_model_device(s->model);
    shard_ctx c = {.dev = dev && !dev->host_memory ? dev : NULL};
    DT_TRY(dt_st_writer_create(&c.w));
    char num[32], file[4200];
    dt_status st = dt_st_writer_meta(c.w, "dtrain.kind", SHARD_KIND);
    if (st == DT_OK) st = dt_st_writer_meta(c.w, "dtrain.save_id", save_id);
    snprintf(num, sizeof num, "%d", r);
    if (st == DT_OK) st = dt_st_writer_meta(c.w, "dtrain.shard", num);
    snprintf(num, sizeof num, "%d", n);
    if (st == DT_OK) st = dt_st_writer_meta(c.w, "dtrain.shards", num);
    if (st == DT_OK) st = dt_st_writer_meta(c.w, "dtrain.model_spec", info->spec);
    if (st == DT_OK) st = dt_strategy_visit_state(s, add_shard_piece, &c);
    dt_ckpt_shard_path(file, sizeof file, path, r, n);
    if (st == DT_OK) st = dt_st_writer_write(c.w, file);
    dt_st_writer_destroy(c.w);
    for (int i = 0; i < c.ncopy; i++) free(c.copy[i]);
    free(c.copy);
    return st;
}

/* One id for this save on every rank (rank 0's random draw): the shards and the index carry it,
 * so shards left by another save under the same name (a crash between the shards and the
 * index, a copied file) are refused instead of mixed in. */
static dt_status agree_save_id(dt_comm *c, char *id, size_t cap) {
    uint64_t v = 0;
    if (dt_comm_rank(c) == 0 && getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) v = (uint64_t)(dt_now() * 1e9);
    DT_TRY(dt_comm_broadcast(c, &v, 1, DT_I64, 0));
    snprintf(id, cap, "%016" PRIx64, v);
    return DT_OK;
}

dt_status dt_checkpoint_write_sharded(const char *path, dt_strategy *s, const dt_ckpt_info *info) {
    const int r = dt_comm_rank(s->comm), n = dt_comm_size(s->comm);
    char id[24];
    DT_TRY(agree_save_id(s->comm, id, sizeof id));
    dt_status mine = write_shard(path, s, info, r, n, id);
    char why[256] = "";
    if (mine != DT_OK) snprintf(why, sizeof why, "%s", dt_last_error());
    int32_t ok = mine == DT_OK, all = 0;
    DT_TRY(dt_comm_allreduce(s->comm, &ok, &all, 1, DT_I32, DT_OP_MIN));
    if (mine != DT_OK) return dt_error(mine, "checkpoint %s: rank %d's shard: %s", path, r, why);
    if (!all) return dt_error(DT_EIO, "checkpoint %s: another rank could not write its shard; no index written", path);
    dt_status st = r == 0 ? dt_checkpoint_write_index(path, s->optim, info, n, id) : DT_OK;
    ok = st == DT_OK;
    DT_TRY(dt_comm_allreduce(s->comm, &ok, &all, 1, DT_I32, DT_OP_MIN));
    if (st != DT_OK) return st;
    return all ? DT_OK : dt_error(DT_EIO, "checkpoint %s: rank 0 could not write the index", path);
}

/* Where piece `name` ("<tensor>" or "optim.<state>.<tensor>") of model m / optimizer o lives:
 * *base (the tensor's first element) and *numel; DT_EFORMAT naming it when nothing matches. */
static dt_status locate(const char *file, const char *name, dt_model *m, dt_optim *o, float **base, size_t *numel,
                        bool *skip) {
    *skip = false;
    const char *tname = name;
    float *slab = NULL;
    if (!strncmp(name, "optim.", 6)) {
        if (!o) return *skip = true, DT_OK;
        const char *dot = strchr(name + 6, '.');
        for (int k = 0; dot && k < dt_optim_num_states(o); k++) {
            const char *sn;
            float *st = dt_optim_state(o, k, &sn);
            if (strlen(sn) == (size_t)(dot - name - 6) && !strncmp(sn, name + 6, strlen(sn))) slab = st;
        }
        if (!slab)
            return dt_error(DT_EFORMAT,
                            "%s: optimizer state '%s' does not match `optimizer` %s; resume with the "
                            "optimizer settings it was trained with",
                            file, name, dt_optim_name(dt_optim_config_of(o)->kind));
        tname = dot + 1;
    }
    int i = dt_model_find_tensor(m, tname);
    if (i < 0) return dt_error(DT_EFORMAT, "%s: tensor '%s' is not in model '%s'", file, tname, dt_model_spec(m));
    const dt_param_info *t = dt_model_tensor(m, i);
    if (!slab) slab = t->is_buffer ? dt_model_buffers(m) : dt_model_params(m);
    else if (t->is_buffer) return dt_error(DT_EFORMAT, "%s: optimizer state for buffer '%s'", file, tname);
    *base = slab + t->offset, *numel = t->numel;
    return DT_OK;
}

/* The id the index at path gives its shards ("" for a checkpoint written before ids). */
static void index_save_id(const char *path, char *id, size_t cap) {
    dt_st_file *f = NULL;
    id[0] = 0;
    if (dt_st_open(&f, path) != DT_OK) return; /* its restore reported it already */
    const char *v = dt_st_meta(f, "dtrain.save_id");
    if (v) snprintf(id, cap, "%s", v);
    dt_st_destroy(f);
}

/* DT_OK when f (file) is shard r of n of the save with id (any, when id is ""). */
static dt_status check_shard(const dt_st_file *f, const char *file, int r, int n, const char *id) {
    const char *kind = dt_st_meta(f, "dtrain.kind"), *sh = dt_st_meta(f, "dtrain.shard"),
               *shs = dt_st_meta(f, "dtrain.shards"), *sid = dt_st_meta(f, "dtrain.save_id");
    if (!kind || strcmp(kind, SHARD_KIND) || !sh || atoi(sh) != r || !shs || atoi(shs) != n)
        return dt_error(DT_EFORMAT, "%s: not shard %d of %d of this checkpoint (metadata dtrain.shard/shards)", file, r,
                        n);
    if (id[0] && (!sid || strcmp(sid, id)))
        return dt_error(DT_EFORMAT,
                        "%s: a shard of another save (its dtrain.save_id %s, the index's %s): the index "
                        "and its shards were not written together (a crash between them, or a copied file); resume "
                        "from an older checkpoint",
                        file, sid ? sid : "(none)", id);
    return DT_OK;
}

/* Copies the pieces of one shard file; *copied grows by the elements restored. */
static dt_status restore_shard(const char *file, int r, int n, const char *id, dt_model *m, dt_optim *o,
                               size_t *copied) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, file));
    dt_status st = check_shard(f, file, r, n, id);
    for (int i = 0; st == DT_OK && i < dt_st_count(f); i++) {
        dt_st_tensor t;
        dt_st_at(f, i, &t);
        char name[160];
        snprintf(name, sizeof name, "%s", t.name);
        char *hash = strrchr(name, '#'), *end = NULL;
        unsigned long long off = hash ? strtoull(hash + 1, &end, 10) : 0;
        if (!hash || !end || *end || t.t.dtype != DT_F32 || t.t.ndim != 1) {
            st = dt_error(DT_EFORMAT, "%s: tensor '%s' is not a piece 'NAME#OFFSET' of F32 values", file, t.name);
            break;
        }
        *hash = 0;
        float *base = NULL;
        size_t numel = 0;
        bool skip = false;
        if ((st = locate(file, name, m, o, &base, &numel, &skip)) != DT_OK || skip) continue;
        const size_t cnt = (size_t)t.t.shape[0];
        if (off + cnt > numel) {
            st = dt_error(DT_EFORMAT,
                          "%s: piece [%llu, %llu) of '%s' lies beyond its %zu elements; the shard is not "
                          "of this model",
                          file, off, off + cnt, name, numel);
            break;
        }
        dt_dev *d = dt_model_device(m); /* the model's and optimizer's memory (cpu: a memcpy) */
        d->ops->upload(d, base + off, t.t.data, cnt * sizeof(float));
        *copied += cnt;
    }
    dt_st_destroy(f);
    return st;
}

dt_status dt_checkpoint_restore_shards(const char *path, int n, dt_model *m, dt_optim *o) {
    size_t copied = 0, want = 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        want += t->numel * (1 + (o && !t->is_buffer ? (size_t)dt_optim_num_states(o) : 0));
    }
    char id[64];
    index_save_id(path, id, sizeof id);
    for (int r = 0; r < n; r++) {
        char file[4200];
        dt_ckpt_shard_path(file, sizeof file, path, r, n);
        dt_status st = restore_shard(file, r, n, id, m, o, &copied);
        if (st != DT_OK) return dt_error_wrap(DT_EFORMAT, "%s: shard %d of %d", path, r, n);
    }
    if (copied != want)
        return dt_error(DT_EFORMAT,
                        "%s: its %d shards hold %zu values, the model and optimizer %zu; a shard is of "
                        "another run",
                        path, n, copied, want);
    return DT_OK;
}

/* ---- restoring a sharded checkpoint into the pieces a strategy reports (tp, ddp's --compress) ---- */

/* One piece of a shard file: values [off, off + n) of tensor name. */
typedef struct {
    char name[160];
    size_t off, n;
    const float *data;
} file_piece;

typedef struct {
    const char *file;
    file_piece *p;
    int np;
    size_t copied, want; /* values restored from the shards, and the values the strategy reports */
} piece_restore;

static int piece_cmp(const void *a, const void *b) {
    const file_piece *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->off > y->off) - (x->off < y->off);
}

/* The pieces of open shard f, sorted by (name, offset). */
static dt_status list_pieces(const char *file, const dt_st_file *f, file_piece **out, int *np) {
    const int n = dt_st_count(f);
    file_piece *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p) return dt_error(DT_ENOMEM, "%s: out of memory", file);
    for (int i = 0; i < n; i++) {
        dt_st_tensor t;
        dt_st_at(f, i, &t);
        const char *hash = strrchr(t.name, '#');
        char *end = NULL;
        unsigned long long off = hash ? strtoull(hash + 1, &end, 10) : 0;
        if (!hash || !end || *end || t.t.dtype != DT_F32 || t.t.ndim != 1 ||
            (size_t)(hash - t.name) >= sizeof p->name) {
            free(p);
            return dt_error(DT_EFORMAT, "%s: tensor '%s' is not a piece 'NAME#OFFSET' of F32 values", file, t.name);
        }
        snprintf(p[i].name, sizeof p[i].name, "%.*s", (int)(hash - t.name), t.name);
        p[i].off = (size_t)off, p[i].n = (size_t)t.t.shape[0], p[i].data = t.t.data;
    }
    qsort(p, (size_t)n, sizeof *p, piece_cmp);
    *out = p, *np = n;
    return DT_OK;
}

/* Copies into piece q what the current shard holds of it (the overlaps with its pieces). */
static dt_status restore_from_shard(void *ctx, const dt_state_piece *q) {
    piece_restore *c = ctx;
    int lo = 0, hi = c->np; /* the first piece of q->name */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(c->p[mid].name, q->name) < 0) lo = mid + 1;
        else hi = mid;
    }
    const size_t a = q->offset, b = q->offset + q->buf.count;
    for (int i = lo; i < c->np && !strcmp(c->p[i].name, q->name) && c->p[i].off < b; i++) {
        const file_piece *f = &c->p[i];
        if (f->off + f->n > q->numel)
            return dt_error(DT_EFORMAT,
                            "%s: piece [%zu, %zu) of '%s' lies beyond its %zu elements; the shard is not "
                            "of this model",
                            c->file, f->off, f->off + f->n, q->name, q->numel);
        const size_t x = f->off > a ? f->off : a, y = f->off + f->n < b ? f->off + f->n : b;
        if (y <= x) continue;
        memcpy((float *)q->buf.data + (x - a), f->data + (x - f->off), (y - x) * sizeof(float));
        if (!q->hint) c->copied += y - x;
    }
    return DT_OK;
}

static dt_status count_wanted(void *ctx, const dt_state_piece *q) {
    piece_restore *c = ctx;
    if (q->buf.dtype != DT_F32 || q->buf.device != DT_DEVICE_CPU)
        return dt_error(DT_ENOTSUP, "checkpoint: tensor '%s' is not f32 host memory", q->name);
    if (!q->hint) c->want += q->buf.count;
    return DT_OK;
}

dt_status dt_checkpoint_restore_shards_into(const char *path, int n, dt_strategy *s) {
    piece_restore c = {0};
    DT_TRY(dt_strategy_visit_state(s, count_wanted, &c));
    char id[64];
    index_save_id(path, id, sizeof id);
    for (int r = 0; r < n; r++) { /* one shard in memory at a time */
        char file[4200];
        dt_ckpt_shard_path(file, sizeof file, path, r, n);
        dt_st_file *f = NULL;
        dt_status st = dt_st_open(&f, file);
        if (st == DT_OK) st = check_shard(f, file, r, n, id);
        c.file = file;
        if (st == DT_OK) st = list_pieces(file, f, &c.p, &c.np);
        if (st == DT_OK) st = dt_strategy_visit_state(s, restore_from_shard, &c);
        free(c.p);
        c.p = NULL, c.np = 0;
        dt_st_destroy(f);
        if (st != DT_OK) return dt_error_wrap(DT_EFORMAT, "%s: shard %d of %d", path, r, n);
    }
    if (c.copied != c.want)
        return dt_error(DT_EFORMAT,
                        "%s: its %d shards hold %zu of the %zu values this rank restores; a shard is of "
                        "another run",
                        path, n, c.copied, c.want);
    return DT_OK;
}
