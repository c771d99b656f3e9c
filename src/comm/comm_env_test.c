/* Unit test of the comm layer's environment rules shared with the CLI: dt_comm_env_is_rank
 * (which variables make a process one rank of a job) agrees with dt_comm_create_from_env, and
 * dt_comm_job_id_valid (the one job-id rule of the shm transport and the launcher). */
#include "core/test.h"
#include "dtrain/comm.h"

#include <stdlib.h>
#include <string.h>

static const char *const g_vars[] = {
    "DTRAIN_RANK",          "DTRAIN_WORLD_SIZE", "DTRAIN_LOCAL_RANK", "DTRAIN_JOB_ID", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "PMI_RANK",          "PMI_SIZE",          "SLURM_PROCID",  "SLURM_NTASKS"};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof g_vars / sizeof *g_vars; i++) unsetenv(g_vars[i]);
}

/* world size dt_comm_create_from_env finds (forcing the self backend so nothing connects) */
static int env_world(void) {
    dt_comm_config cc = dt_comm_config_default();
    dt_comm *c = NULL;
    if (dt_comm_create_from_env(&c, &cc) != DT_OK) return -1;
    int n = dt_comm_size(c);
    dt_comm_destroy(c);
    return n;
}

int main(void) {
    clear_env();
    CHECK(!dt_comm_env_is_rank());
    CHECK(env_world() == 1);

    /* an sbatch script: SLURM_PROCID alone is not a rank (comm runs it as a single process) */
    setenv("SLURM_PROCID", "0", 1);
    CHECK(!dt_comm_env_is_rank());
    CHECK(env_world() == 1);
    setenv("SLURM_NTASKS", "1", 1); /* srun -n 1: one rank of a one-rank job */
    CHECK(dt_comm_env_is_rank());
    setenv("SLURM_PROCID", "", 1);
    CHECK(!dt_comm_env_is_rank());
    clear_env();

    setenv("PMI_RANK", "0", 1);
    CHECK(!dt_comm_env_is_rank());
    setenv("PMI_SIZE", "1", 1);
    CHECK(dt_comm_env_is_rank());
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    CHECK(dt_comm_env_is_rank());
    clear_env();
    setenv("DTRAIN_RANK", "0", 1); /* dtrain launch sets both; either one means "a rank" */
    CHECK(dt_comm_env_is_rank());
    clear_env();

    /* job ids: one rule for the launcher and the shm transport */
    CHECK(dt_comm_job_id_valid("data"));
    CHECK(dt_comm_job_id_valid("0123abcdef_X"));
    CHECK(dt_comm_job_id_valid("job.3.1")); /* split segments */
    CHECK(!dt_comm_job_id_valid(NULL));
    CHECK(!dt_comm_job_id_valid(""));
    CHECK(!dt_comm_job_id_valid("data-0123456789abcdef")); /* would match the data-set cache */
    CHECK(!dt_comm_job_id_valid("../etc"));
    CHECK(!dt_comm_job_id_valid("a b"));
    char id[DT_COMM_JOB_ID_MAX + 2];
    memset(id, 'a', sizeof id - 1);
    id[DT_COMM_JOB_ID_MAX] = 0;
    CHECK(dt_comm_job_id_valid(id));
    id[DT_COMM_JOB_ID_MAX] = 'a';
    id[DT_COMM_JOB_ID_MAX + 1] = 0;
    CHECK(!dt_comm_job_id_valid(id));
    return dt_test_summary("comm_env_test");
}
