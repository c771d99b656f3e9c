/* The federated-learning server: waits for clients, runs rounds (sample C of the connected
 * clients, send the global model, collect updates until the round deadline, aggregate by FedAvg
 * weighted by sample count, or DP-FedAvg with per-client clipping and Gaussian noise), evaluates,
 * checkpoints the global model (resumable) and writes one JSONL metrics line per round. */
#include "device/device.h"
#include "fl/server_internal.h"
#include "run/checkpoint.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

dt_status dt_fl_server_sa_round(dt_fl_server *s, dt_fl_model_msg *mm, double *agg, int *nupd);
int dt_fl_server_sa_frame(dt_fl_server *s, int c, uint16_t type, const uint8_t *p, uint32_t len);

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static dt_status listen_on(dt_fl_server *s) {
    struct sockaddr_in a;
    DT_TRY(dt_fl_parse_addr(s->cfg.listen, "`listen`", &a));
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (s->lfd >= 0) setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof a) || listen(s->lfd, 256))
        return dt_error(DT_EIO, "`listen` %s: %s (is another server on that port?)", s->cfg.listen, strerror(errno));
    socklen_t al = sizeof a;
    getsockname(s->lfd, (struct sockaddr *)&a, &al);
    s->port = ntohs(a.sin_port);
    return DT_OK;
}

static dt_status resume(dt_fl_server *s) {
    dt_ckpt_info info;
    dt_status st = dt_checkpoint_read_info(s->cfg.checkpoint, &info);
    if (st == DT_ENOENT || (st != DT_OK && access(s->cfg.checkpoint, F_OK) != 0)) {
        dt_log(DT_LOG_WARN, "fl server: `resume`: no checkpoint %s yet, starting at round 0", s->cfg.checkpoint);
        dt_error_clear();
        return DT_OK;
    }
    DT_TRY(st);
    if (strcmp(info.spec, dt_model_spec(s->m)))
        return dt_error(DT_EMISMATCH, "`resume` %s: the checkpoint holds model '%s', this server has '%s'",
                        s->cfg.checkpoint, info.spec, dt_model_spec(s->m));
    DT_TRY(dt_checkpoint_restore(s->cfg.checkpoint, s->m, NULL, &info));
    s->round = (int)info.step;
    dt_log(DT_LOG_WARN, "fl server: resumed from %s after round %d", s->cfg.checkpoint, s->round);
    return DT_OK;
}

/* The largest frame a registered client sends: its update, or the secure-aggregation messages of
 * a round of clients_per_round (keys, shares to each other member, masked input, unmasking). */
static uint32_t frame_limit(const dt_fl_server *s) {
    uint64_t n = 12 + 4 * (uint64_t)s->np; /* update: round, samples, n, n floats (masked: 8 + 4 n) */
    uint64_t sa = 4 + (uint64_t)s->cfg.clients_per_round * (DT_SA_SHARE_MSG > 34 ? DT_SA_SHARE_MSG : 34);
    if (s->cfg.secure && sa > n) n = sa;
    return n > DT_FL_MAX_PAYLOAD ? DT_FL_MAX_PAYLOAD : (uint32_t)n;
}

/* Raises the soft open-file limit to what --max-clients + --max-pending need (warns when the hard
 * limit is lower: accept then evicts pending peers, and rests when there are none). */
static void fd_limit(const dt_fl_server *s) {
    struct rlimit r;
    rlim_t need = (rlim_t)s->cap + 64;
    if (getrlimit(RLIMIT_NOFILE, &r) || r.rlim_cur >= need) return;
    r.rlim_cur = r.rlim_max == RLIM_INFINITY || r.rlim_max >= need ? need : r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
    if (r.rlim_cur < need)
        dt_log(DT_LOG_WARN,
               "fl server: the open-file limit is %llu, `max_clients` + `max_pending` need %llu; "
               "raise it (ulimit -n) or lower them",
               (unsigned long long)r.rlim_cur, (unsigned long long)need);
}

static dt_status check_limits(dt_fl_server_config *c) {
    if (c->hello_timeout == 0) c->hello_timeout = DT_FL_HELLO_TIMEOUT;
    if (c->max_clients == 0) c->max_clients = DT_FL_MAX_CLIENTS;
    if (c->max_pending == 0) c->max_pending = DT_FL_MAX_PENDING;
    if (!(c->hello_timeout > 0)) return dt_error(DT_EINVAL, "`hello_timeout` %g: need > 0 seconds", c->hello_timeout);
    if (c->max_clients < 1 || c->max_clients > DT_FL_MAX_CLIENTS)
        return dt_error(DT_EINVAL, "`max_clients` %d: need 1..%d", c->max_clients, DT_FL_MAX_CLIENTS);
    if (c->max_pending < 1 || c->max_pending > DT_FL_MAX_PENDING_LIMIT)
        return dt_error(DT_EINVAL, "`max_pending` %d: need 1..%d", c->max_pending, DT_FL_MAX_PENDING_LIMIT);
    int need = c->min_clients > c->clients_per_round ? c->min_clients : c->clients_per_round;
    if (c->start_clients > need) need = c->start_clients;
    if (need > c->max_clients)
        return dt_error(DT_EINVAL,
                        "`max_clients` %d is below the %d clients that `clients_per_round`/`min_clients` "
                        "need; raise `max_clients`",
                        c->max_clients, need);
    return DT_OK;
}

dt_status dt_fl_server_create(dt_fl_server **out, const dt_fl_server_config *cfg, dt_model *m, const dt_dataset *test) {
    *out = NULL;
    if (cfg->clients_per_round < 1 || cfg->clients_per_round > DT_FL_MAX_CLIENTS)
        return dt_error(DT_EINVAL, "`clients_per_round` %d: need 1..%d", cfg->clients_per_round, DT_FL_MAX_CLIENTS);
    if (cfg->secure && (cfg->clients_per_round < 2 || cfg->clients_per_round > DT_SA_MAX))
        return dt_error(DT_EINVAL, "`secure_agg` needs `clients_per_round` in 2..%d", DT_SA_MAX);
    if (dt_model_num_params(m) > DT_FL_MAX_PARAMS)
        return dt_error(DT_EINVAL, "fl server: the model has %zu parameters, the protocol carries at most %u",
                        dt_model_num_params(m), DT_FL_MAX_PARAMS);
    dt_fl_server_config c = *cfg;
    if (c.min_clients < 1) c.min_clients = c.clients_per_round;
    DT_TRY(check_limits(&c));
    dt_fl_server *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ENOMEM, "fl server: out of memory");
    s->cfg = c, s->m = m, s->test = test, s->lfd = -1, s->np = dt_model_num_params(m);
    s->cap = c.max_clients + c.max_pending + 1;
    s->frame_max = frame_limit(s);
    s->tx_max = 2 * (DT_FL_HEADER + 48 + 4 * s->np) + (1u << 20); /* a model message: 48 bytes of settings, n floats */
    s->conns = calloc((size_t)s->cap, sizeof *s->conns);
    s->pf = calloc((size_t)s->cap + 1, sizeof *s->pf);
    s->global = malloc(s->np * sizeof(float));
    dt_status st = s->conns && s->pf && s->global ? DT_OK : dt_error(DT_ENOMEM, "fl server: out of memory");
    if (st == DT_OK) fd_limit(s);
    if (st == DT_OK && cfg->resume && cfg->checkpoint) st = resume(s);
    if (st == DT_OK) /* the model's device's memory (the cpu device: a memcpy) */
        dt_model_device(m)->ops->download(dt_model_device(m), s->global, dt_model_params(m), s->np * sizeof(float));
    if (st == DT_OK) st = listen_on(s);
    if (st != DT_OK) {
        dt_fl_server_destroy(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

int dt_fl_server_port(const dt_fl_server *s) { return s->port; }

void dt_fl_server_destroy(dt_fl_server *s) {
    if (!s) return;
    dt_fl_conns_close(s);
    for (int i = 0; i < DT_FL_MAX_CLIENTS; i++) free(s->upd[i]);
    dt_fl_sa_server_free(s->sa);
    dt_fl_server_sa_free(s);
    free(s->conns), free(s->pf), free(s->global), free(s);
}

static int registered(const dt_fl_server *s);

static int on_hello(dt_fl_server *s, int c, const uint8_t *p, uint32_t len) {
    dt_fl_hello h;
    if (s->conns[c].registered) return dt_error(DT_EFORMAT, "a second hello"), 1;
    if (dt_fl_hello_decode(p, len, &h) != DT_OK) return 1;
    for (int i = 0; i < s->nconns; i++)
        if (i != c && s->conns[i].fd >= 0 && s->conns[i].registered && s->conns[i].id == h.client_id)
            dt_fl_conn_drop(s, i, "the same client connected again");
    if (registered(s) >= s->cfg.max_clients) {
        char why[128];
        snprintf(why, sizeof why, "client %llu refused: %d clients registered (`max_clients`)",
                 (unsigned long long)h.client_id, registered(s));
        dt_fl_conn_drop_counted(s, c, &s->n_full, why);
        return 0;
    }
    dt_fl_conn *k = &s->conns[c];
    k->registered = 1, k->id = h.client_id, k->samples = h.samples;
    k->rd.max_len = s->frame_max; /* from now on: its update, no more */
    snprintf(k->name + strlen(k->name), sizeof k->name - strlen(k->name), " client %llu",
             (unsigned long long)h.client_id);
    dt_log(DT_LOG_INFO, "fl server: %s joined with %u samples", k->name, h.samples);
    return 0;
}

static int on_update(dt_fl_server *s, int c, const uint8_t *p, uint32_t len) {
    dt_fl_update_msg u;
    dt_fl_conn *k = &s->conns[c];
    if (dt_fl_update_decode(p, len, (uint32_t)s->np, &u) != DT_OK) return 1;
    if (!k->in_round || u.round != (uint32_t)s->round + 1 || s->sa) {
        dt_log(DT_LOG_INFO, "fl server: ignoring a late update of round %u from %s", u.round, k->name);
        return 0;
    }
    if (u.samples != k->samples)
        return dt_error(DT_EFORMAT, "update claims %u samples, the client announced %u", u.samples, k->samples), 1;
    int slot = k->in_round - 1;
    if (s->upd[slot]) return dt_error(DT_EFORMAT, "a second update in round %u", u.round), 1;
    if (!(s->upd[slot] = malloc(s->np * sizeof(float)))) return dt_error(DT_ENOMEM, "out of memory"), 1;
    memcpy(s->upd[slot], u.delta, s->np * sizeof(float));
    s->upd_samples[slot] = u.samples;
    s->nupd++;
    return 0;
}

int dt_fl_server_on_frame(dt_fl_server *s, int c, uint16_t type, const uint8_t *p, uint32_t len) {
    if (type != DT_FL_HELLO && !s->conns[c].registered) return dt_error(DT_EFORMAT, "message before hello"), 1;
    switch (type) {
    case DT_FL_HELLO: return on_hello(s, c, p, len);
    case DT_FL_UPDATE: return on_update(s, c, p, len);
    case DT_FL_SA_KEYS:
    case DT_FL_SA_SHARES:
    case DT_FL_SA_MASKED:
    case DT_FL_SA_UNMASK: return dt_fl_server_sa_frame(s, c, type, p, len);
    default: return dt_error(DT_EFORMAT, "unexpected message type %u from a client", type), 1;
    }
}

static int registered(const dt_fl_server *s) {
    int n = 0;
    for (int i = 0; i < s->nconns; i++) n += s->conns[i].fd >= 0 && s->conns[i].registered;
    return n;
}

/* Samples the round's clients among the registered ones (seeded by round and attempt). */
static void select_clients(dt_fl_server *s, int attempt) {
    int pool[DT_FL_MAX_CLIENTS], n = 0;
    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i].fd >= 0 && s->conns[i].registered) pool[n++] = i;
    /* by client id: the sample must not depend on the order in which clients connected */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && s->conns[pool[j - 1]].id > s->conns[pool[j]].id; j--) {
            int t = pool[j];
            pool[j] = pool[j - 1], pool[j - 1] = t;
        }
    uint64_t key = dt_rng_key(DT_RNG_USER + 18, (uint64_t)s->round * 64 + (uint64_t)attempt);
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(dt_rng_u64(s->cfg.seed, key, (uint64_t)i) % (uint64_t)(i + 1)), t = pool[i];
        pool[i] = pool[j], pool[j] = t;
    }
    s->nsel = n < s->cfg.clients_per_round ? n : s->cfg.clients_per_round;
    s->nupd = s->ndropped = s->nlate = 0;
    for (int i = 0; i < s->nsel; i++) {
        s->sel[i] = pool[i];
        s->sel_id[i] = s->conns[pool[i]].id;
        s->conns[pool[i]].in_round = i + 1;
        free(s->upd[i]);
        s->upd[i] = NULL;
    }
}

static void end_round(dt_fl_server *s) {
    for (int i = 0; i < s->nconns; i++) s->conns[i].in_round = 0;
    for (int i = 0; i < s->nsel; i++) free(s->upd[i]), s->upd[i] = NULL;
}

static dt_fl_model_msg model_msg(const dt_fl_server *s) {
    dt_fl_model_msg mm = {.round = (uint32_t)s->round + 1,
                          .epochs = s->cfg.epochs,
                          .batch = s->cfg.batch,
                          .lr = s->cfg.lr,
                          .mu = s->cfg.mu,
                          .seed = s->cfg.seed,
                          .n = (uint32_t)s->np,
                          .params = s->global};
    return mm;
}

/* The plain round: updates in the clear; agg gets sum_u w_u delta_u / sum_u w_u (or the DP sum). */
static dt_status plain_round(dt_fl_server *s, double *agg, int *nupd) {
    dt_fl_model_msg mm = model_msg(s);
    dt_fl_buf b = {0};
    DT_TRY(dt_fl_model_encode(&b, &mm));
    for (int i = 0; i < s->nsel; i++) dt_fl_conn_queue(s, s->sel[i], DT_FL_MODEL, b.p, (uint32_t)b.n);
    dt_fl_buf_free(&b);
    double deadline = dt_now() + s->cfg.round_timeout;
    while (s->nupd < s->nsel - s->ndropped && dt_now() < deadline) dt_fl_server_pump(s, deadline);
    uint8_t late[DT_FL_MAX_CLIENTS];
    for (int i = 0; i < s->nsel; i++) late[i] = !s->upd[i];
    dt_fl_server_drop_late(s, late, "update"); /* a stalled client must not hold up the next rounds too */
    double W = 0;
    for (int i = 0; i < s->nsel; i++)
        if (s->upd[i]) W += s->cfg.dp_clip > 0 ? 1.0 : s->upd_samples[i];
    memset(agg, 0, s->np * sizeof *agg);
    for (int i = 0; i < s->nsel; i++) {
        if (!s->upd[i]) continue;
        if (s->cfg.dp_clip > 0) dt_fl_clip(s->upd[i], s->np, s->cfg.dp_clip);
        dt_fl_accumulate(agg, s->upd[i], s->np, s->cfg.dp_clip > 0 ? 1.0 : s->upd_samples[i] / W);
    }
    *nupd = s->nupd;
    return DT_OK;
}

/* DP-FedAvg: the sum of clipped updates plus N(0, (sigma clip)^2), over the fixed denominator C. */
static void add_dp_noise(dt_fl_server *s, double *agg) {
    if (s->cfg.dp_clip <= 0) return;
    uint64_t nseed;
    randombytes_buf(&nseed, sizeof nseed); /* unpredictable to the clients, unlike a seeded stream */
    float z[1024];
    for (size_t off = 0; off < s->np; off += 1024) {
        size_t k = s->np - off < 1024 ? s->np - off : 1024;
        dt_rng_fill_normal(z, k, 0, (float)(s->cfg.dp_noise * s->cfg.dp_clip), nseed, off / 1024);
        for (size_t i = 0; i < k; i++) agg[off + i] = (agg[off + i] + z[i]) / s->cfg.clients_per_round;
    }
}

static void write_metrics(const dt_fl_server *s, const dt_fl_round_stats *st) {
    if (!s->cfg.quiet)
        printf("round %4d  clients %3d/%-3d  dropped %d (late %d)  retries %d  test acc %.4f  loss %.4f%s  %.2f s  "
               "server cpu %.1f ms\n",
               st->round, st->updates, st->sampled, st->dropped, st->late, st->retries, st->acc, st->loss, "",
               st->wall_s, 1e3 * st->server_cpu_s);
    if (!s->cfg.quiet && st->eps >= 0) printf("           DP: epsilon %.3f at delta %g\n", st->eps, s->cfg.dp_delta);
    fflush(stdout);
    if (!s->cfg.metrics) return;
    FILE *f = fopen(s->cfg.metrics, "a");
    if (!f) {
        dt_log(DT_LOG_WARN, "fl server: cannot append to `metrics` %s: %s", s->cfg.metrics, strerror(errno));
        return;
    }
    char acc[32] = "null", loss[32] = "null"; /* not evaluated this round */
    if (!isnan(st->acc)) snprintf(acc, sizeof acc, "%.6f", st->acc), snprintf(loss, sizeof loss, "%.6f", st->loss);
    fprintf(f,
            "{\"round\":%d,\"sampled\":%d,\"updates\":%d,\"dropped\":%d,\"late\":%d,\"retries\":%d,\"test_acc\":%s,"
            "\"test_loss\":%s,\"epsilon\":%.6g,\"delta\":%g,\"wall_s\":%.6f,\"server_cpu_ms\":%.3f,"
            "\"bytes_in\":%llu,\"bytes_out\":%llu,\"secure\":%s}\n",
            st->round, st->sampled, st->updates, st->dropped, st->late, st->retries, acc, loss, st->eps,
            st->eps >= 0 ? s->cfg.dp_delta : 0, st->wall_s, 1e3 * st->server_cpu_s, (unsigned long long)st->bytes_in,
            (unsigned long long)st->bytes_out, s->cfg.secure ? "true" : "false");
    fclose(f);
}

static dt_status finish_round(dt_fl_server *s, const double *agg, dt_fl_round_stats *st) {
    for (size_t i = 0; i < s->np; i++) s->global[i] += (float)agg[i];
    s->round++;
    st->acc = st->loss = NAN;
    dt_model_device(s->m)->ops->upload(dt_model_device(s->m), dt_model_params(s->m), s->global, s->np * sizeof(float));
    int every = s->cfg.eval_every > 0 ? s->cfg.eval_every : 1;
    if (s->test && (s->round % every == 0 || s->round == s->cfg.rounds))
        DT_TRY(dt_fl_evaluate(s->m, s->test, &st->acc, &st->loss));
    st->eps = -1;
    if (s->cfg.dp_clip > 0) {
        int K = registered(s) > s->cfg.clients_per_round ? registered(s) : s->cfg.clients_per_round;
        st->eps = dt_fl_dp_epsilon((double)s->cfg.clients_per_round / K, s->cfg.dp_noise, s->round, s->cfg.dp_delta,
                                   NULL);
    }
    if (s->cfg.checkpoint) {
        dt_ckpt_info info = {.step = s->round,
                             .epoch = s->round,
                             .seed = s->cfg.seed,
                             .world_size = 1,
                             .lr = s->cfg.lr,
                             .batch = s->cfg.batch > 0 ? (int)s->cfg.batch : 1};
        snprintf(info.spec, sizeof info.spec, "%s", dt_model_spec(s->m));
        snprintf(info.optimizer, sizeof info.optimizer, "sgd");
        info.C = 1, info.H = 1, info.W = dt_model_in_size(s->m);
        if (s->test) dt_dataset_shape(s->test, &info.C, &info.H, &info.W);
        DT_TRY(dt_checkpoint_write(s->cfg.checkpoint, s->m, NULL, &info));
    }
    return DT_OK;
}

static dt_status wait_clients(dt_fl_server *s) {
    double deadline = dt_now() + s->cfg.wait_timeout;
    int need = s->started || s->cfg.start_clients < s->cfg.min_clients ? s->cfg.min_clients : s->cfg.start_clients;
    while (registered(s) < need) {
        if (dt_now() >= deadline)
            return dt_error(DT_ETIMEDOUT,
                            "fl server: only %d of the %d clients needed (`min_clients`) connected within "
                            "%.0f s (`wait_timeout`); start more fl-client processes",
                            registered(s), need, s->cfg.wait_timeout);
        dt_fl_server_pump(s, deadline);
    }
    s->started = 1;
    return DT_OK;
}

/* One round, retried when no usable update came. */
static dt_status run_round(dt_fl_server *s, double *agg, dt_fl_round_stats *st) {
    double t0 = dt_now();
    uint64_t in0 = s->bytes_in, out0 = s->bytes_out;
    double cpu = 0;
    for (int attempt = 0;; attempt++) {
        DT_TRY(wait_clients(s));
        double c0 = thread_cpu();
        select_clients(s, attempt);
        int nupd = 0;
        dt_fl_model_msg mm = model_msg(s);
        dt_status rs = s->cfg.secure ? dt_fl_server_sa_round(s, &mm, agg, &nupd) : plain_round(s, agg, &nupd);
        st->sampled = s->nsel, st->dropped = s->ndropped, st->late = s->nlate;
        end_round(s);
        cpu += thread_cpu() - c0;
        if (rs == DT_OK && nupd > 0) {
            st->updates = nupd, st->retries = attempt;
            break;
        }
        if (rs != DT_OK && rs != DT_EPEER && rs != DT_ETIMEDOUT) return rs;
        if (attempt >= s->cfg.retries)
            return dt_error(DT_EPEER, "fl server: round %d failed %d times (last: %s)", s->round + 1, attempt + 1,
                            rs != DT_OK ? dt_last_error() : "no client sent an update");
        dt_log(DT_LOG_WARN, "fl server: round %d: %s; retrying", s->round + 1,
               rs != DT_OK ? dt_last_error() : "no client sent an update");
    }
    double c1 = thread_cpu();
    add_dp_noise(s, agg);
    cpu += thread_cpu() - c1;
    st->round = s->round + 1;
    DT_TRY(finish_round(s, agg, st));
    st->server_cpu_s = cpu;
    st->wall_s = dt_now() - t0;
    st->bytes_in = s->bytes_in - in0, st->bytes_out = s->bytes_out - out0;
    return DT_OK;
}

dt_status dt_fl_server_run(dt_fl_server *s, dt_fl_round_fn fn, void *ctx) {
    double *agg = malloc(s->np * sizeof *agg);
    if (!agg) return dt_error(DT_ENOMEM, "fl server: out of memory");
    dt_status st = DT_OK;
    while (s->round < s->cfg.rounds && st == DT_OK) {
        dt_fl_round_stats rs = {0};
        if ((st = run_round(s, agg, &rs)) != DT_OK) break;
        write_metrics(s, &rs);
        if (fn) fn(ctx, &rs);
        /* test hook: SIGKILL this server right after round N is checkpointed (no BYE, no flush) */
        const char *kill_after = getenv("DTRAIN_FL_KILL_AFTER_ROUND");
        if (kill_after && atoi(kill_after) == s->round) raise(SIGKILL);
    }
    free(agg);
    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i].fd >= 0) dt_fl_conn_queue(s, i, DT_FL_BYE, NULL, 0);
    dt_fl_server_flush(s, dt_now() + 5);
    return st;
}
