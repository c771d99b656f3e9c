/* Splitting an MPI transport (ops->split): the members meet on the parent within the deadline
 * (the leader collects and compares everyone's split id and color, then releases them), then
 * build the new communicator with MPI_Comm_create_group, which only the members call. */
#include "comm/transport.h"

#ifdef DT_HAVE_MPI
#include "comm/transport_mpi.h"

#include <stdlib.h>
#include <string.h>

#define LOCK() pthread_mutex_lock(&dt_mpi_lock)
#define UNLOCK() pthread_mutex_unlock(&dt_mpi_lock)

/* Split: the members first meet (bounded by the deadline) on the parent, then build the
 * communicator with MPI_Comm_create_group, which only the members call. */
dt_status dt_mpi_split(dt_transport *tt, int color, const int *members, int new_size, int new_rank, uint64_t split_id,
                       double deadline, dt_transport **out) {
    dt_mpi_transport *t = (dt_mpi_transport *)tt;
    *out = NULL;
    if (new_size < 1 || members[new_rank] != tt->rank)
        return dt_error(DT_EINVAL, "split: rank %d is not member %d of its group", tt->rank, new_rank);
    uint64_t mine[2] = {split_id, (uint64_t)(int64_t)color}, *theirs = NULL;
    dt_treq *reqs = calloc((size_t)new_size, sizeof *reqs);
    dt_treq **rp = calloc((size_t)new_size, sizeof *rp);
    if (new_size > 1) theirs = calloc((size_t)new_size * 2, sizeof *theirs);
    dt_status s = reqs && rp && (new_size == 1 || theirs) ? DT_OK : dt_error(DT_ENOMEM, "split: out of memory");
    int nr = 0;
    if (s == DT_OK && new_rank == 0) { /* the leader collects everyone, then releases them */
        for (int i = 1; i < new_size && s == DT_OK; i++, nr++)
            s = dt_mpi_post(t, true, members[i], DT_COMM_TAG_MAX + 1, DT_MPI_TAG_SPLIT, theirs + 2 * i, sizeof mine,
                            &reqs[i]);
        for (int i = 1; i <= nr; i++) rp[i - 1] = &reqs[i];
        if (s == DT_OK && nr > 0) s = dt_mpi_waitall(tt, rp, nr, deadline);
        for (int i = 1; i < new_size && s == DT_OK; i++)
            if (memcmp(theirs + 2 * i, mine, sizeof mine))
                s = dt_mpi_fail(t, DT_EMISMATCH, "split: rank %d is in a different split or color than rank %d",
                                members[i], tt->rank);
        for (int i = 1; i < new_size && s == DT_OK; i++) {
            s = dt_mpi_post(t, false, members[i], DT_COMM_TAG_MAX + 1, DT_MPI_TAG_SPLIT, mine, sizeof mine, &reqs[i]);
            rp[i - 1] = &reqs[i];
        }
        if (s == DT_OK && new_size > 1) s = dt_mpi_waitall(tt, rp, new_size - 1, deadline);
    } else if (s == DT_OK) {
        uint64_t back[2];
        s = dt_mpi_post(t, false, members[0], DT_COMM_TAG_MAX + 1, DT_MPI_TAG_SPLIT, mine, sizeof mine, &reqs[0]);
        if (s == DT_OK)
            s = dt_mpi_post(t, true, members[0], DT_COMM_TAG_MAX + 1, DT_MPI_TAG_SPLIT, back, sizeof back, &reqs[1]);
        rp[0] = &reqs[0];
        rp[1] = &reqs[1];
        if (s == DT_OK) s = dt_mpi_waitall(tt, rp, 2, deadline);
    }
    free(reqs);
    free(rp);
    free(theirs);
    if (s != DT_OK) return s;

    MPI_Group parent, group;
    MPI_Comm comm = MPI_COMM_NULL;
    LOCK();
    MPI_Comm_group(t->comm, &parent);
    int rc = MPI_Group_incl(parent, new_size, members, &group);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Comm_create_group(t->comm, group, (int)(split_id % 32768), &comm);
        MPI_Group_free(&group);
    }
    MPI_Group_free(&parent);
    if (rc == MPI_SUCCESS) s = dt_mpi_wrap(comm, t->timeout_s, out);
    UNLOCK();
    if (rc != MPI_SUCCESS) {
        char e[256];
        return dt_mpi_fail(t, DT_EPEER, "split: MPI_Comm_create_group failed: %s", dt_mpi_errstr(rc, e, sizeof e));
    }
    if (s == DT_OK && (*out)->rank != new_rank)
        return dt_error(DT_EINTERNAL, "split: MPI gave rank %d, expected %d", (*out)->rank, new_rank);
    return s;
}

#else
typedef int dt_transport_mpi_split_unused; /* built without MPI: see transport_mpi.c */
#endif
