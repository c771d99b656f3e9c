/* Parameter server, dynamic assignment (see ps.h): the units each worker holds, the set of
 * units in on this server (done_lo and the sorted seqs above it), the bounded delay (a unit is
 * handed out, or its pull request answered, only while it is at most s rounds of W units ahead
 * of done_lo), server 0's hand-out with the quiet finish, and the pull requests servers > 0
 * take. Everything here runs with the server lock held. */
#include "parallel/ps_server.h"

#include <stdlib.h>
#include <string.h>

#define QUIET_UNITS 16 /* units per worker at the end of the run trained one at a time */

/* Dynamic: the units worker w holds (pending slots: 2 with overlap, else 1). */
int dt_ps_slots(const server *sv) { return sv->p->overlap ? 2 : 1; }

static int held(const server *sv, int w) {
    int n = 0;
    for (int k = 0; k < dt_ps_slots(sv); k++) n += sv->pending[w * 2 + k] >= 0;
    return n;
}

/* Worker w holds seq q (q < 0: nothing); without a free slot the oldest is replaced. */
static void hold(server *sv, int w, int64_t q) {
    if (q < 0) return;
    int k = 0;
    while (k < dt_ps_slots(sv) - 1 && sv->pending[w * 2 + k] >= 0) k++;
    sv->pending[w * 2 + k] = q;
}

/* Worker w pushed seq q: true when it held it (the slot is cleared). */
bool dt_ps_release(server *sv, int w, int64_t q) {
    for (int k = 0; k < dt_ps_slots(sv); k++)
        if (q >= 0 && sv->pending[w * 2 + k] == q) return sv->pending[w * 2 + k] = -1, true;
    return false;
}

/* Dynamic: records seq q as in; false when it already was (with the lock held). */
static bool mark_done(server *sv, int64_t q) {
    if (q < sv->done_lo) return false;
    int k = 0;
    while (k < sv->nahead && sv->ahead[k] < q) k++;
    if (k < sv->nahead && sv->ahead[k] == q) return false;
    if (q == sv->done_lo) {
        sv->done_lo++;
    } else {
        if (sv->nahead == sv->cap_ahead) {
            int cap = sv->cap_ahead ? 2 * sv->cap_ahead : 256;
            int64_t *a = realloc(sv->ahead, (size_t)cap * sizeof *a);
            if (!a) {
                sv->oom = true;
                return true;
            }
            sv->ahead = a, sv->cap_ahead = cap;
        }
        memmove(sv->ahead + k + 1, sv->ahead + k, (size_t)(sv->nahead - k) * sizeof *sv->ahead);
        sv->ahead[k] = q;
        sv->nahead++;
    }
    int j = 0;
    while (j < sv->nahead && sv->ahead[j] == sv->done_lo) j++, sv->done_lo++;
    if (j > 0) {
        memmove(sv->ahead, sv->ahead + j, (size_t)(sv->nahead - j) * sizeof *sv->ahead);
        sv->nahead -= j;
    }
    return true;
}

/* Dynamic: how many rounds (of W units) seq q is ahead of the oldest unit not yet in. */
static int64_t round_gap(const server *sv, int64_t q) { return q / sv->p->W - sv->done_lo / sv->p->W; }

/* Dynamic: the epoch index (from ep0) of seq q. */
int64_t dt_ps_seq_epoch(const server *sv, int64_t q) {
    int64_t e, u;
    dt_ps_seq_unit(q, sv->cfg->start_epoch, sv->cfg->start_step_in_epoch * sv->p->W, sv->units, &e, &u);
    return e - sv->ep0;
}

/* Dynamic: seq q is in; counts it for its epoch once (with the lock held). */
void dt_ps_unit_in(server *sv, int64_t q) {
    int64_t e = dt_ps_seq_epoch(sv, q);
    if (mark_done(sv, q) && e >= 0 && e < sv->nep) sv->units_done[e]++;
}

/* Dynamic: a seq as a resume position (epoch, global batches of batch x workers done). */
void dt_ps_seq_position(const server *sv, int64_t q, int64_t *epoch, int64_t *in_epoch) {
    const dt_serve_config *c = sv->cfg;
    int64_t unit;
    dt_ps_seq_unit(q, c->start_epoch, c->start_step_in_epoch * sv->p->W, sv->units, epoch, &unit);
    *in_epoch = unit / sv->p->W;
}

/* Quiet finish: whether worker w must wait for a unit: another holds one, or w is not the worker
 * that trained the most units (the fastest; the lowest index on a tie) among those that will ask
 * for more (alive, not gone, not stopped by max_steps). */
static bool quiet_wait(const server *sv, int w) {
    int best = -1;
    for (int x = 0; x < sv->p->W; x++) {
        if (x != w && held(sv, x) > 0) return true; /* with overlap: units held ahead too */
        bool asks = sv->alive[x] && !sv->bye[x] && sv->clock[x] < sv->total;
        if (asks && (best < 0 || sv->wunits[x] > sv->wunits[best])) best = x;
    }
    return best != w;
}

/* Dynamic, server 0: fills r with worker w's next unit, or none (with the lock held). The last
 * units of the run (QUIET_UNITS per worker, at most 1/16 of the run) are trained by the fastest
 * worker alone, one at a time (staleness 0; the others wait for the goodbye): a finish with every
 * worker stale left the final model less accurate and more spread than one whose last steps are
 * not stale (docs/why.md, "ps: a quiet finish"). */
void dt_ps_assign(server *sv, int w, int64_t clk, ps_reply *r) {
    const dt_serve_config *c = sv->cfg;
    const int64_t u0 = c->start_step_in_epoch * sv->p->W;
    const int64_t run = (c->epochs - c->start_epoch) * sv->units - u0;
    int64_t quiet = (int64_t)QUIET_UNITS * sv->p->W;
    if (quiet > run / 16) quiet = run / 16;
    const int64_t quiet_from = sv->p->W > 1 ? run - quiet : INT64_MAX;
    for (;;) {
        r->seq = -1, r->epoch = -1, r->unit = -1, r->bye = 0, r->later = 0;
        if (clk >= sv->total) return; /* max_steps: the worker stops by itself, no goodbye */
        /* overlap: a unit handed out now is trained at step clk + 1, behind the one the worker
         * holds; none that max_steps would leave untrained (and its epoch never complete) */
        if (sv->p->overlap && clk + held(sv, w) >= sv->total) {
            r->later = 1;
            return;
        }
        r->bye = 1;
        if (sv->stopping) return;
        int64_t q = sv->nrequeue > 0 ? sv->requeue[sv->nrequeue - 1] : sv->next_seq;
        int64_t e, u;
        dt_ps_seq_unit(q, c->start_epoch, u0, sv->units, &e, &u);
        if (e >= c->epochs) return;
        /* overlap, quiet finish: a worker still holding a unit gets none ahead; it asks again (and
         * waits, blocking) after training that one, so it never waits here holding a unit */
        if (sv->p->overlap && q >= quiet_from && held(sv, w) > 0) {
            r->bye = 0, r->later = 1;
            return;
        }
        /* bounded staleness: not more than s rounds ahead of the oldest unit still out */
        if ((q >= quiet_from && quiet_wait(sv, w)) || (sv->p->staleness >= 0 && round_gap(sv, q) > sv->p->staleness)) {
            pthread_cond_wait(&sv->cv, &sv->mu);
            continue;
        }
        if (round_gap(sv, q) > sv->max_gap) sv->max_gap = (int)round_gap(sv, q);
        if (sv->nrequeue > 0) sv->nrequeue--;
        else sv->next_seq++;
        hold(sv, w, q);
        *r = (ps_reply){.seq = q, .epoch = e, .unit = u, .bye = 0};
        return;
    }
}

/* Dynamic, servers > 0: takes worker w's pull request, which names the unit server 0 handed
 * it, and holds the answer while that unit is more than s rounds ahead of the units in here
 * (with the lock held; released while receiving). */
dt_status dt_ps_pull(server *sv, int w) {
    ps_push m;
    pthread_mutex_unlock(&sv->mu);
    dt_status st = dt_comm_broadcast(sv->p->pair[w], &m, sizeof m, DT_U8, 1);
    pthread_mutex_lock(&sv->mu);
    if (st != DT_OK) return st;
    if (m.n != PS_N_PULL)
        return dt_error(DT_EMISMATCH,
                        "ps server rank %d: worker rank %d sent a push (n = %d) where a pull request "
                        "belongs",
                        sv->p->me, sv->p->S + w, m.n);
    hold(sv, w, m.seq);
    while (m.seq >= 0 && sv->p->staleness >= 0 && round_gap(sv, m.seq) > sv->p->staleness && !sv->stopping &&
           sv->alive[w])
        pthread_cond_wait(&sv->cv, &sv->mu);
    return DT_OK;
}
