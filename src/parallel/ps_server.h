/* Parameter server, server side: the state every server keeps (ps_server.c serves with it,
 * ps_assign.c hands out the units of dynamic assignment) and what the two files share. Private
 * to src/dist. */
#ifndef DT_DIST_PS_SERVER_H
#define DT_DIST_PS_SERVER_H

#include "parallel/ps.h"

#include <pthread.h>

#define PS_MAX_NOTES 64

typedef struct server server;

typedef struct {
    server *sv;
    int w; /* worker index */
    pthread_t thread;
    bool started;
    float *grad, *out; /* shard-sized receive and answer buffers */
} handler;

struct server {
    ps_state *p;
    dt_strategy *s;
    const dt_serve_config *cfg;
    int idx;       /* server index */
    size_t lo, n;  /* shard */
    float *w;      /* shard parameters */
    dt_optim *opt; /* shard optimizer */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* clocks, deaths, ends */
    int64_t version, total;
    int64_t *clock; /* [W] steps pushed */
    bool *alive;    /* [W] */
    bool *bye;      /* [W] dynamic: said goodbye (done, not dead) */
    /* dynamic assignment */
    int64_t units;    /* units per epoch */
    int64_t next_seq; /* server 0: next seq never handed out */
    int64_t *pending; /* [W * 2] seqs held by each worker (handed out by server 0, named by a
                       * pull request on the others), not yet pushed (-1); slot 1: overlap */
    int64_t *requeue; /* server 0: [W * 2] seqs of dropped workers to hand out again */
    int64_t *wunits;  /* server 0: [W] units each worker pushed in this run */
    int nrequeue;
    int64_t *units_done; /* [nep] units pushed by epoch */
    int64_t done_lo;     /* every seq below it is in (pushed here, or lost on servers > 0) */
    int64_t *ahead;      /* sorted seqs above done_lo that are in */
    int nahead, cap_ahead;
    bool oom; /* ahead could not grow: the serve loop fails */
    int nlive;
    int running;   /* handler threads still serving */
    bool stopping; /* stop requested: answer at once, let the workers leave quietly */
    /* figures since the last epoch report, by epoch of the pushed step */
    int64_t ep0, nep;  /* first epoch, epochs tracked */
    double *loss_sum;  /* [nep] */
    int64_t *samples;  /* [nep] */
    int64_t *wsamples; /* [nep * W] */
    double *wbusy;     /* [nep * W] */
    double *wait;      /* [nep] exchange waits the workers reported */
    int64_t *pushes;   /* [nep] */
    int64_t stale[DT_STALENESS_BINS];
    int max_gap;
    char notes[PS_MAX_NOTES][192];
    int nnotes;
};

/* ---- the server's books (ps_server.c) ---- */

/* Allocates sv's per-worker and per-epoch arrays for sv->p->W workers and sv->nep epochs, zeroed;
 * DT_ENOMEM (nothing left allocated) otherwise. */
dt_status dt_ps_books_alloc(server *sv);
/* Frees them (the seqs above done_lo too); safe on a partial or freed set. */
void dt_ps_books_free(server *sv);

/* ---- a worker's push (ps_server.c); with the server lock held ---- */

/* DT_OK when push m of worker w is possible here (counts, version, step, unit in range); else
 * DT_EFORMAT naming the field. */
dt_status dt_ps_push_check(const server *sv, int w, const ps_push *m);
/* Records a checked push: staleness, epoch figures, the unit trained, w's clock; wakes waiters. */
void dt_ps_push_record(server *sv, int w, const ps_push *m);

/* ---- dynamic assignment (ps_assign.c); all with the server lock held ---- */

/* Units a worker may hold at once (2 with overlap, else 1): its pending slots. */
int dt_ps_slots(const server *sv);
/* Worker w pushed unit q: clears q from its slots; false if it did not hold q. */
bool dt_ps_release(server *sv, int w, int64_t q);
/* Unit q is in on this server (pushed, or lost with a dead worker on servers > 0); counts it
 * for its epoch once. */
void dt_ps_unit_in(server *sv, int64_t q);
/* The epoch index (from ep0) of unit q. */
int64_t dt_ps_seq_epoch(const server *sv, int64_t q);
/* Unit q as a resume position: epoch and global batches of batch x workers done in it. */
void dt_ps_seq_position(const server *sv, int64_t q, int64_t *epoch, int64_t *in_epoch);
/* Server 0: fills r with worker w's next unit (after its push made its clock clk), or none;
 * may wait for the staleness bound or the quiet finish. */
void dt_ps_assign(server *sv, int w, int64_t clk, ps_reply *r);
/* Servers > 0: takes worker w's pull request and waits for the bound on the unit it names
 * (releases the lock while receiving). */
dt_status dt_ps_pull(server *sv, int w);

#endif
