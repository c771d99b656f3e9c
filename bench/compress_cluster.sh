#!/usr/bin/env bash
# Gradient compression and hierarchical allreduce on an emulated slow cluster (network namespaces
# capped with tc tbf, scripts/netns-hosts; mpirun through its rsh agent), one run:
#  1. 2 hosts x 1 rank at RATE_TRAIN (100mbit): the MLP on Fashion-MNIST, EPOCHS epochs of ddp
#     (batch 32 per rank, Adam 1e-3) with --compress none, topk:0.01, powersgd:2 and powersgd:2 after
#     300 plain steps (COMPRESSORS="..." picks others; the first is the speedups' baseline): time to test
#     accuracy 0.85 (epoch granularity: wall time at the end of the first epoch reaching it), the
#     final accuracy, the bytes per step the compressor counted, the bytes it should send by its
#     stated ratio, and the bytes host 1 really sent per step (veth counter, TCP/IP included);
#  2. 2 hosts x 2 ranks at RATE_COMM (1gbit): allreduce bus bandwidth, flat ring vs hierarchical,
#     at 4 MiB and above (dtrain bench comm --allreduce flat,hier: both in the same job).
# Prints the CPU, the kernel set, a table and one JSON line. Needs root, ip netns, mpirun and an
# MPI build (else exits 77 with the reason). Figures depend on the machine's load: say so.
#   bench/compress_cluster.sh [EPOCHS=3]      (RATE_TRAIN, RATE_COMM, DT, COMPRESSORS override;
#                                              PARTS=train or PARTS=comm: one part only)
set -u
cd "$(dirname "$0")/.."
EPOCHS=${1:-3} RATE_TRAIN=${RATE_TRAIN:-100mbit} RATE_COMM=${RATE_COMM:-1gbit}
DT=$(cd "$(dirname "${DT:-build/dtrain}")" && pwd)/$(basename "${DT:-build/dtrain}")
HOSTS="$PWD/scripts/netns-hosts" NET=10.77.0
if ! why=$("$HOSTS" check 2>&1); then echo "skip: needs root and ip netns ($why)"; exit 77; fi
command -v mpirun >/dev/null || { echo "skip: mpirun not found (install openmpi-bin)"; exit 77; }
exec 9>/tmp/dtrain-netns.lock
flock -w 300 9 || { echo "another netns run holds /tmp/dtrain-netns.lock"; exit 1; }
NAME="dtb$$" T=$(mktemp -d)
trap '"$HOSTS" down "$NAME" 2; rm -rf "$T"' EXIT
trap 'exit 130' INT TERM
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() {  # NP SLOTS CMD...
  local np=$1 slots=$2; shift 2
  printf '%s-1 slots=%s\n%s-2 slots=%s\n' "$NAME" "$slots" "$NAME" "$slots" >"$T/hf"
  mpirun --hostfile "$T/hf" -np "$np" --mca plm_rsh_agent "$HOSTS agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$NET.0/24" --mca btl tcp,self --mca btl_tcp_if_include "$NET.0/24" \
    --bind-to none --oversubscribe ${DTRAIN_HIER_CHUNK:+-x DTRAIN_HIER_CHUNK} "$@"
}
sent() { cat "/sys/class/net/$NAME-v1/statistics/rx_bytes"; }  # what host 1 sent into the bridge

cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)
kern=$("$DT" bench train --model mlp --seconds 0.2 2>/dev/null | grep -E '^# (openblas|onednn|cpu)' | tr '\n' ' ')
echo "# cpu: $cpu ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); other jobs share this machine)"
echo "# kernels: $kern"

PARTS=${PARTS:-train,comm}
RATE=$RATE_TRAIN "$HOSTS" up "$NAME" 2 "$NET" || exit 1
runs=()
for c in ${COMPRESSORS:-none topk:0.01 powersgd:2 powersgd:2:warmup=300}; do
  [ "${PARTS#*train}" = "$PARTS" ] && break
  b0=$(sent)
  mpi 2 1 "$DT" train --data fashion-mnist --model mlp --epochs "$EPOCHS" --batch 32 --optimizer adam --lr 0.001 \
    --compress "$c" --quiet --metrics "$T/$c.jsonl" >"$T/$c.log" 2>&1 || { echo "FAIL: $c: $(tail -3 "$T/$c.log")"; exit 1; }
  runs+=("$c $(($(sent) - b0))")
done
"$HOSTS" down "$NAME" 2
RATE=$RATE_COMM "$HOSTS" up "$NAME" 2 "$NET" || exit 1
[ "${PARTS#*comm}" = "$PARTS" ] && : >"$T/comm.log" ||
mpi 4 2 "$DT" bench comm --backend mpi --colls allreduce --sizes 4M,16M,64M --allreduce flat,hier --trials 2 \
  >"$T/comm.log" 2>&1 || { echo "FAIL: bench comm: $(tail -3 "$T/comm.log")"; exit 1; }

python3 - "$T" "$RATE_TRAIN" "$RATE_COMM" "$cpu" "${runs[@]}" <<'PY'
import json, math, sys
T, rate_train, rate_comm, cpu = sys.argv[1:5]
n = 784 * 128 + 128 + 128 * 10 + 10  # MLP parameters (one 1 MB bucket)
def stated(c):  # bytes per step and rank by the compressor's own formula
    if c == "none": return 4 * n
    if c.startswith("topk:"): return 8 * math.ceil(float(c[5:]) * n - 1e-9)
    r = int(c.split(":")[1])
    return 4 * ((128 + 784) * r + (10 + 128) * r + 128 + 10)
rows, out = [], []
for arg in sys.argv[5:] if len(sys.argv) > 5 else []:
    c, veth = arg.split()
    recs = [json.loads(l) for l in open("%s/%s.jsonl" % (T, c))]
    hit = next((r for r in recs if r["test_acc"] >= 0.85), None)
    steps = recs[-1]["step"]
    sync = recs[-1].get("sync", {})
    rows.append(dict(compress=c, epochs=len(recs), time_to_085_s=hit["wall_s"] if hit else None,
                     epoch_at_085=hit["epoch"] if hit else None, final_acc=recs[-1]["test_acc"],
                     wall_s=recs[-1]["wall_s"], step_ms=sum(r["epoch_s"] for r in recs) / steps * 1e3,
                     bytes_counted=sync.get("bytes_per_step"), bytes_stated=stated(c),
                     veth_bytes_per_step=int(veth) / steps))
base = rows[0] if rows else dict(epochs=0, time_to_085_s=None)
print("\n# 2 hosts x 1 rank, links %s (tbf), MLP, batch 32/rank, Adam 1e-3, %d epochs" % (rate_train, base["epochs"]))
print("%-12s %10s %8s %9s %9s %12s %12s %12s %9s %9s" % ("compress", "t(0.85) s", "epoch", "final acc",
      "step ms", "bytes/step", "stated", "veth B/step", "counted/", "speedup"))
for r in rows:
    sp = base["time_to_085_s"] / r["time_to_085_s"] if base["time_to_085_s"] and r["time_to_085_s"] else None
    r["speedup_to_085"] = sp
    r["counted_over_stated"] = r["bytes_counted"] / r["bytes_stated"] if r["bytes_counted"] else None
    print("%-12s %10s %8s %9.4f %9.2f %12.0f %12.0f %12.0f %9.3f %9s" % (r["compress"],
          "%.1f" % r["time_to_085_s"] if r["time_to_085_s"] else "-", r["epoch_at_085"] or "-", r["final_acc"],
          r["step_ms"], r["bytes_counted"] or 0, r["bytes_stated"], r["veth_bytes_per_step"],
          r["counted_over_stated"] or 0, "%.2fx" % sp if sp else "-"))
res = {}
for line in open(T + "/comm.log"):
    if line.startswith("{"):
        for x in json.loads(line)["results"]:
            res.setdefault(x["bytes"], {})[x["algo"]] = x["busbw_gbs"]
print("\n# 2 hosts x 2 ranks, links %s (tbf): allreduce busbw (GB/s), f32 sum, MPI transport" % rate_comm)
print("%12s %10s %10s %8s" % ("bytes", "flat", "hier", "hier/flat"))
hier = []
for b in sorted(res):
    f, h = res[b].get("auto"), res[b].get("hier")
    hier.append(dict(bytes=b, flat_busbw_gbs=f, hier_busbw_gbs=h, ratio=h / f if f and h else None))
    print("%12d %10.4f %10.4f %8.2fx" % (b, f or 0, h or 0, h / f if f and h else 0))
print(json.dumps(dict(bench="compress_cluster", cpu=cpu, rate_train=rate_train, rate_comm=rate_comm, runs=rows,
                      hier=hier)))
PY
