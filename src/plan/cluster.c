/* Cluster files for the planner (dtrain plan --cluster FILE): JSON read with cJSON, every field
 * checked, and a bad one named with what to write. The format (docs/plan.md):
 *   {"name": "dgx-a100", "hosts": 1, "ranks_per_host": 8,
 *    "device": {"peak_tflops": {"fp32": 19.5, "bf16": 312, "fp16": 312}, "efficiency": 0.5,
 *               "mem_bandwidth_GB_s": 2039, "mem_GB": 80, "overlap": 0.9,
 *               "node_overhead_us": 10, "step_overhead_ms": 0},
 *    "links": {"intra": {"bandwidth_Gbit_s": 2400, "latency_us": 3},
 *              "inter": {"bandwidth_Gbit_s": 1600, "latency_us": 5}}}
 * Inter-node bandwidth is a host's aggregate (all its NICs), shared by its ranks. Optional:
 * device.collective_wait_us (a blocking collective's wait for descheduled ranks, per rendezvous)
 * and links.*.reduce_scatter_factor (a reduce-scatter's cost over the ring's: 2 over MPI/TCP). */
#include "plan/plan.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const g_prec[DT_PLAN_NPREC] = {"fp32", "bf16", "fp16"};

/* A number field key of object o into *v: required (or *v keeps its default), > 0 (or >= 0 where
 * zero_ok), at most max. Errors name the file and the path. */
static dt_status num(const cJSON *o, const char *path, const char *key, bool required, bool zero_ok, double max,
                     const char *example, const char *what, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x) {
        if (!required) return DT_OK;
        return dt_error(DT_EINVAL, "cluster file %s: %s%s%s: missing (a number%s, e.g. %s)", what, path,
                        *path ? "." : "", key, zero_ok ? " >= 0" : " > 0", example);
    }
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0 || (!zero_ok && x->valuedouble == 0) ||
        x->valuedouble > max)
        return dt_error(DT_EINVAL, "cluster file %s: %s%s%s: not a number in %s%g] (e.g. %s)", what, path,
                        *path ? "." : "", key, zero_ok ? "[0, " : "(0, ", max, example);
    *v = x->valuedouble;
    return DT_OK;
}

static dt_status object(const cJSON *o, const char *path, const char *key, bool required, const char *what,
                        const cJSON **out) {
    *out = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!*out && !required) return DT_OK;
    if (!*out)
        return dt_error(DT_EINVAL, "cluster file %s: %s%s%s: missing (an object; see examples/clusters/)", what, path,
                        *path ? "." : "", key);
    if (!cJSON_IsObject(*out))
        return dt_error(DT_EINVAL, "cluster file %s: %s%s%s: not an object (see examples/clusters/)", what, path,
                        *path ? "." : "", key);
    return DT_OK;
}

static dt_status parse_device(const cJSON *d, const char *what, dt_plan_cluster *c) {
    const cJSON *pk;
    DT_TRY(object(d, "device", "peak_tflops", true, what, &pk));
    for (const cJSON *x = pk->child; x; x = x->next) {
        int k = 0;
        while (k < DT_PLAN_NPREC && strcmp(x->string, g_prec[k])) k++;
        if (k == DT_PLAN_NPREC)
            return dt_error(DT_EINVAL, "cluster file %s: device.peak_tflops.%s: unknown precision (fp32, bf16, fp16)",
                            what, x->string);
    }
    for (int k = 0; k < DT_PLAN_NPREC; k++) {
        double t = 0;
        DT_TRY(num(pk, "device.peak_tflops", g_prec[k], k == DT_PLAN_FP32, k != DT_PLAN_FP32, 1e6, "19.5", what, &t));
        c->peak[k] = t * 1e12;
    }
    double gbs = 0, gb = 0, oh_us = c->node_overhead * 1e6, st_ms = c->step_overhead * 1e3;
    DT_TRY(num(d, "device", "mem_bandwidth_GB_s", true, false, 1e6, "2039", what, &gbs));
    DT_TRY(num(d, "device", "mem_GB", true, false, 1e6, "80", what, &gb));
    DT_TRY(num(d, "device", "efficiency", false, false, 1, "0.5", what, &c->efficiency));
    DT_TRY(num(d, "device", "overlap", false, true, 1, "0.8", what, &c->overlap));
    DT_TRY(num(d, "device", "node_overhead_us", false, true, 1e6, "10", what, &oh_us));
    DT_TRY(num(d, "device", "step_overhead_ms", false, true, 1e6, "1", what, &st_ms));
    double wait_us = c->coll_wait * 1e6;
    DT_TRY(num(d, "device", "collective_wait_us", false, true, 1e7, "0", what, &wait_us));
    c->coll_wait = wait_us * 1e-6;
    c->mem_bw = gbs * 1e9, c->mem_bytes = gb * 1e9, c->node_overhead = oh_us * 1e-6, c->step_overhead = st_ms * 1e-3;
    return DT_OK;
}

static dt_status parse_link(const cJSON *links, const char *key, bool required, const char *what, dt_plan_link *l) {
    const cJSON *o;
    DT_TRY(object(links, "links", key, required, what, &o));
    if (!o) return DT_OK;
    char path[32];
    snprintf(path, sizeof path, "links.%s", key);
    double gbit = 0, us = 0;
    DT_TRY(num(o, path, "bandwidth_Gbit_s", true, false, 1e7, "200", what, &gbit));
    DT_TRY(num(o, path, "latency_us", true, true, 1e7, "5", what, &us));
    double rsf = 1;
    DT_TRY(num(o, path, "reduce_scatter_factor", false, false, 100, "1", what, &rsf));
    l->bw = gbit * 1e9 / 8, l->lat = us * 1e-6, l->rs_factor = rsf;
    return DT_OK;
}

static dt_status parse_root(const cJSON *root, const char *what, dt_plan_cluster *c) {
    if (!cJSON_IsObject(root)) return dt_error(DT_EINVAL, "cluster file %s: not a JSON object", what);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
    if (nm && !cJSON_IsString(nm)) return dt_error(DT_EINVAL, "cluster file %s: name: not a string", what);
    snprintf(c->name, sizeof c->name, "%s", nm ? nm->valuestring : "cluster");
    double hosts = 1, rph = 0;
    DT_TRY(num(root, "", "hosts", false, false, 1e6, "2", what, &hosts));
    DT_TRY(num(root, "", "ranks_per_host", true, false, 1e4, "8", what, &rph));
    if (hosts != floor(hosts) || rph != floor(rph))
        return dt_error(DT_EINVAL, "cluster file %s: %s: not a whole number", what,
                        hosts != floor(hosts) ? "hosts" : "ranks_per_host");
    c->hosts = (int)hosts, c->ranks_per_host = (int)rph;
    const cJSON *dev, *links;
    DT_TRY(object(root, "", "device", true, what, &dev));
    DT_TRY(parse_device(dev, what, c));
    DT_TRY(object(root, "", "links", true, what, &links));
    DT_TRY(parse_link(links, "intra", true, what, &c->link[DT_PLAN_INTRA]));
    c->link[DT_PLAN_INTER] = c->link[DT_PLAN_INTRA];
    DT_TRY(parse_link(links, "inter", c->hosts > 1, what, &c->link[DT_PLAN_INTER]));
    for (const cJSON *x = root->child; x; x = x->next)
        if (strcmp(x->string, "name") && strcmp(x->string, "hosts") && strcmp(x->string, "ranks_per_host") &&
            strcmp(x->string, "device") && strcmp(x->string, "links") && strcmp(x->string, "comment") &&
            strcmp(x->string, "source"))
            return dt_error(DT_EINVAL,
                            "cluster file %s: %s: unknown field (name, hosts, ranks_per_host, device, links, "
                            "comment, source)",
                            what, x->string);
    return DT_OK;
}

dt_status dt_plan_cluster_parse(const char *text, const char *what, dt_plan_cluster *c) {
    *c = (dt_plan_cluster){.efficiency = 0.5, .overlap = 0.8, .link = {{.rs_factor = 1}, {.rs_factor = 1}}};
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return dt_error(DT_EINVAL, "cluster file %s: not valid JSON (near '%.20s')", what, at ? at : "");
    }
    dt_status s = parse_root(root, what, c);
    cJSON_Delete(root);
    return s;
}

dt_status dt_plan_cluster_load(const char *path, dt_plan_cluster *c) {
    FILE *f = fopen(path, "rb");
    if (!f) return dt_error(DT_EIO, "cluster file %s: cannot open it: %s", path, strerror(errno));
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    const bool big = buf && n == (1 << 20) - 1, bad = ferror(f);
    fclose(f);
    if (!buf) return dt_error(DT_ENOMEM, "cluster file %s: out of memory", path);
    if (big || bad) {
        free(buf);
        return dt_error(DT_EIO, "cluster file %s: %s", path,
                        bad ? "read error" : "larger than 1 MB: not a cluster file");
    }
    buf[n] = '\0';
    dt_status s = dt_plan_cluster_parse(buf, path, c);
    free(buf);
    return s;
}

dt_status dt_plan_cluster_save(const dt_plan_cluster *c, const char *path) {
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= sizeof tmp)
        return dt_error(DT_EINVAL, "cluster file %s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return dt_error(DT_EIO, "cluster file %s: cannot write it: %s", tmp, strerror(errno));
    fprintf(f, "{\"name\": \"%s\", \"hosts\": %d, \"ranks_per_host\": %d,\n \"device\": {\"peak_tflops\": {", c->name,
            c->hosts, c->ranks_per_host);
    for (int k = 0, n = 0; k < DT_PLAN_NPREC; k++)
        if (c->peak[k] > 0) fprintf(f, "%s\"%s\": %.6g", n++ ? ", " : "", g_prec[k], c->peak[k] / 1e12);
    fprintf(f,
            "}, \"efficiency\": %.6g, \"mem_bandwidth_GB_s\": %.6g, \"mem_GB\": %.6g, \"overlap\": %.6g, "
            "\"node_overhead_us\": %.6g, \"step_overhead_ms\": %.6g, \"collective_wait_us\": %.6g},\n \"links\": {",
            c->efficiency, c->mem_bw / 1e9, c->mem_bytes / 1e9, c->overlap, c->node_overhead * 1e6,
            c->step_overhead * 1e3, c->coll_wait * 1e6);
    for (int k = 0; k < 2; k++)
        fprintf(f, "%s\"%s\": {\"bandwidth_Gbit_s\": %.6g, \"latency_us\": %.6g, \"reduce_scatter_factor\": %.6g}",
                k ? ", " : "", k ? "inter" : "intra", c->link[k].bw * 8 / 1e9, c->link[k].lat * 1e6,
                c->link[k].rs_factor > 0 ? c->link[k].rs_factor : 1);
    fprintf(f, "}}\n");
    const bool ok = fflush(f) == 0 && !ferror(f) && fsync(fileno(f)) == 0;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return dt_error(DT_EIO, "cluster file %s: cannot write it: %s", path, strerror(e));
    }
    return DT_OK;
}
