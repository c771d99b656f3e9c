/* Internals of the parameter-server strategy shared by ps.c (layout, connections, the worker
 * side), ps_server.c (the serve loop) and ps_assign.c (dynamic assignment).
 *
 * Layout: job ranks 0..S-1 are servers, S..S+W-1 workers (worker index = rank - S). Server i
 * holds parameters [lo_i, hi_i) with lo_i = floor(i * P / S): a byte-balanced shard.
 *
 * Connections: every (server, worker) pair has its own two-rank communicator (split from the
 * job's at start; server = rank 0 of it, worker = rank 1). A worker that dies breaks only its
 * own pairs, so the servers see DT_EPEER there, drop it and go on with the others; the job's
 * communicator is not used again after start-up. Servers also share one communicator among
 * themselves (S > 1) to assemble the model on server 0 at each epoch's end.
 *
 * Protocol on a pair, per worker step, as four two-rank broadcasts (on shm these take the direct
 * shared-buffer path, faster than tagged point-to-point through the 32 KB fragments of the p2p
 * channel: docs/why.md, "ps exchanges as broadcasts"): the worker (root 1) sends a ps_push header and its gradient
 * slice; the server applies its optimizer to the slice at once, then answers (root 0), when the
 * staleness bound allows, with a ps_reply header and its current parameter slice, which the
 * worker receives straight into its parameters. Both sides make the same calls in the same
 * order, so the collective mismatch checks of the communicator apply too.
 *
 * Dynamic batch assignment (the default; fixed_shards turns it off): the workers own no shards.
 * The epoch's (seed, epoch) global order is cut into units of `batch` samples (the single-process
 * batches, units_per_epoch = ceil(n / batch)); numbering the units of all remaining epochs one
 * after another as seq 0, 1, 2, ... from the start position, worker w trains seq w first and
 * server 0 hands out the next free seq in each reply (ps_reply.epoch/unit), so a fast worker
 * trains more units and a slow one fewer, and every unit is trained once. With S > 1 servers the
 * worker then sends each server i > 0 a pull request (n = PS_N_PULL) naming the unit server 0
 * handed it, before that server's answer.
 *
 * Staleness under dynamic assignment counts rounds: round k is seqs k*W .. k*W+W-1, one global
 * batch of the single-process run (the "step" of synchronous training). A unit of round k is
 * handed out (server 0), and its parameters answered (every server), only once every unit of
 * rounds below k - s is in: the bounded delay of Li et al. (OSDI 2014). So s = 0 trains round
 * after round like synchronous data parallelism, each gradient misses at most (2s+1)W - 1
 * updates, and a worker that stays slow holds nobody back unless its unit falls s rounds behind
 * (per-worker clocks would hold every worker to its pace: that is fixed_shards).
 *
 * A server counts an epoch as done once all its units were pushed. A dropped worker's unhanded
 * unit is handed out again. The last few units of the run (16 per worker) are handed out one at
 * a time, so the final model is not left by stale gradients (ps_assign.c says why). When nothing
 * is left (or the run is stopping) server 0 answers unit -1 with bye = 1 and the worker sends
 * every server a last header with n = -1 (goodbye), which the server acknowledges with a reply
 * header, and leaves.
 *
 * Checkpoints of a dynamic run (--save at each epoch end, the interrupt checkpoint on SIGTERM)
 * record the model server 0 assembled and a position in the usual terms (epoch, step_in_epoch
 * in global batches of batch x workers, world_size = workers, batch), so a resume (with either
 * mode) continues where it says: step_in_epoch = floor(u / workers), u = the first unit not yet
 * pushed (every unit below it was trained; on a stop server 0 hands out no new unit, so u is
 * normally every unit handed out; with overlap, u is at most the first unit a worker held ahead
 * untrained). The at most workers - 1 units between step_in_epoch x workers and u, and any unit
 * above u that was pushed before a worker died, are trained again after a resume; the resumed
 * run's first epoch is complete once its units from step_in_epoch x workers on are in. The step
 * recorded is the most steps any worker did (the workers' clocks differ under dynamic
 * assignment; it drives --max-steps, while the learning-rate schedule follows the rounds).
 *
 * Overlap (--ps-overlap; dynamic assignment and --staleness inf only): a worker's exchange (push,
 * pull requests, answers) runs on a per-worker thread while the worker trains its next unit: the
 * gradient is copied into a send buffer, the answer lands in a staging buffer, and before the
 * next exchange the worker waits for this one and copies the staged parameters into its model,
 * so each gradient is computed on parameters one exchange older (one more step of staleness in
 * the servers' histogram). For that the worker must know its next unit before the answer comes:
 * each worker starts holding two units (seq w and seq W + w; server 0 hands out from 2W), each
 * answer hands out one more, the servers keep two pending slots per worker (a push clears its
 * unit; a dropped worker's units are both handed out again). In the quiet finish server 0 hands
 * nothing ahead (seq -1, bye 0) to a worker that still holds a unit; that worker trains it,
 * and its next exchange is waited for at once (blocking, as without overlap), so quiet_wait
 * counts held units. Likewise (later, nothing handed out) to a worker whose max_steps ends it
 * after the unit it holds, so that no unit is handed out and left untrained. A worker drains its
 * exchange in flight before a goodbye or leaving. */
#ifndef DT_DIST_PS_H
#define DT_DIST_PS_H

#include "parallel/strategy.h"

#include <pthread.h>

enum { PS_TAG_SHARD = 10 };             /* server -> server 0 at an epoch end: params, then optimizer states */
enum { PS_N_BYE = -1, PS_N_PULL = -2 }; /* ps_push.n of a goodbye and of a pull request */

typedef struct {
    int64_t step;    /* the worker's step (0-based); its clock becomes step + 1 */
    int64_t epoch;   /* epoch of that step */
    int64_t version; /* server version the gradient was computed on (from the last reply) */
    int32_t n;       /* samples of the step (0: nothing to apply), or PS_N_BYE / PS_N_PULL */
    float lr;        /* learning rate of the step */
    double loss_sum; /* sum of the per-sample losses */
    double busy_s;   /* forward+backward time, including a --slow sleep */
    double wait_s;   /* how long the worker's previous exchange blocked it (0 for its first) */
    int64_t seq;     /* dynamic: the unit trained (a pull request: the next unit); -1 otherwise */
} ps_push;

typedef struct {
    int64_t version;          /* pushes applied to this shard so far */
    int64_t seq, epoch, unit; /* dynamic, server 0: the worker's next unit; unit -1 = none */
    int32_t bye;              /* dynamic, server 0: no next unit; say goodbye to every server */
    int32_t later; /* overlap, server 0: no unit ahead now (quiet finish, max_steps); ask after the one held */
} ps_reply;

/* ps's options: "ps(servers=S,staleness=S|inf,shards=dynamic|fixed,overlap=0|1)". */
typedef struct {
    int servers;       /* the first `servers` ranks are servers, >= 1 (default 1) */
    int staleness;     /* bound in steps (rounds of W batches, see above), < 0 = unbounded (default) */
    bool fixed_shards; /* shards=fixed: each worker owns 1/W of every epoch, SSP on its own steps
                        * (default shards=dynamic: the workers take the next batch from server 0) */
    bool overlap;      /* dynamic assignment, staleness < 0 only: a worker's push and pull run in the
                        * background while it trains the next batch (one unit held ahead, above) */
} ps_opts;

typedef struct {
    int S, W;            /* servers, workers */
    int me;              /* job rank */
    int staleness;       /* < 0: unbounded */
    bool dynamic;        /* dynamic batch assignment (not fixed_shards) */
    size_t P;            /* parameters */
    struct dt_dev *mdev; /* the model's device (cpu included): the worker's uploads and downloads */
    struct dt_dev *dev;  /* the model's device when it is staged through host buffers (both sides),
                          * else NULL */
    size_t *lo;          /* [S + 1] shard bounds */
    dt_comm **pair;      /* server: [W] its pair with worker w; worker: [S] its pair with server i */
    dt_comm *servers;    /* servers among themselves (S > 1), else NULL */
    /* worker side */
    ps_push *push;                 /* [S] */
    ps_reply *reply;               /* [S] */
    int64_t *version;              /* [S] last version seen from each server */
    int64_t seq;                   /* dynamic: the unit this worker trains now */
    int64_t next_epoch, next_unit; /* dynamic: the unit it trains next (next_unit < 0: none left);
                                    * overlap: before the first step, the unit held ahead (seq W + w) */
    double last_wait;              /* the previous step's exchange wait (reported in the next push) */
    /* worker side, overlap (see the top): the exchange thread and its buffers */
    bool overlap;
    float *gsend, *wstage; /* [P] the gradient being pushed; the parameters being pulled (also
                            * without overlap where dev is set: the host copies of the exchange) */
    int64_t held[2][3];    /* units held ahead, oldest first: seq, epoch, unit */
    int nheld;
    bool bye;        /* server 0 said bye: nothing to hand out now */
    bool inflight;   /* main thread: an exchange was started and its answer not yet taken */
    bool first_done; /* the first step took the unit ahead named by the trainer */
    pthread_t thread;
    bool thread_started, busy, quit; /* busy: an exchange is in flight */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t xstep; /* the step of the exchange (for pull requests) */
    dt_status xst; /* result of the last exchange, with its message */
    char xmsg[512];
} ps_state;

/* Dynamic assignment: the (epoch, unit) of seq q counted from unit u0 of epoch e0. */
static inline void dt_ps_seq_unit(int64_t q, int64_t e0, int64_t u0, int64_t units_per_epoch, int64_t *epoch,
                                  int64_t *unit) {
    int64_t k = u0 + q;
    *epoch = e0 + k / units_per_epoch, *unit = k % units_per_epoch;
}

/* Worker side, overlap: waits for the exchange in flight (if any) and takes its answer (the
 * parameters and the unit handed out); a no-op otherwise. Done before a worker leaves (and by tests). */
dt_status dt_ps_worker_drain(dt_strategy *s);

/* Server side: serves the workers of s (role DT_ROLE_SERVER) until they are all done or gone. */
dt_status dt_ps_serve(dt_strategy *s, const dt_serve_config *cfg);

#endif
