#!/usr/bin/env bash
# Gradient compression and hierarchical allreduce on an emulated slow cluster (network namespaces
# capped with tc tbf, scripts/netns-hosts; mpirun through its rsh agent), one run:
#  1. 2 hosts x 1 rank at each link rate of RATE_TRAIN (100mbit; a list, e.g. "100mbit 1gbit", gives the
#     table of time to accuracy per compressor and link rate): MODEL (mlp; or cnn) on Fashion-MNIST, EPOCHS epochs of
#     ddp (batch 32 per rank, Adam 1e-3) with --compress none, topk:0.01, powersgd:2 and powersgd:2 after
#     300 plain steps (COMPRESSORS="..." picks others; the first is the speedups' baseline): time to test
#     accuracy TARGET (0.85; epoch granularity: wall time at the end of the first epoch reaching it), the
#     final accuracy, the bytes per step the compressor counted, the bytes it should send by its
#     stated ratio, and the bytes host 1 really sent per step (veth counter: its data, TCP/IP/Ethernet
#     headers, its ACKs of host 2's data, MPI's headers and dtrain's op check): over the whole run and
#     over the steps after epoch 1 (without start-up: MPI wire-up, the parameter broadcast);
#  2. the bytes per step without start-up, exactly: per compressor two runs of WIRE_STEPS="100 500"
#     steps, the difference, at three levels against the stated bytes: the TCP stream (veth bytes
#     less 66 B a packet: what MPI wrote), the veth, and MTU frames (66 B a TCP segment, what a
#     real 1500 B-MTU NIC would add); with and without dtrain's op check (WIRE_CHECKS="1 0");
#     the ratio column compares uncompressed/compressed veth bytes with the stated ratio;
#  3. 2 hosts x 2 ranks at RATE_COMM (1gbit): allreduce bus bandwidth, flat vs hierarchical, at
#     4 MiB and above (dtrain bench comm --allreduce flat,flat:ring,hier x3: interleaved in the
#     same job, the best of each reported). Flat is what dtrain runs un-hierarchically (auto: Open
#     MPI's MPI_Iallreduce, libnbc's Rabenseifner at 4 ranks: its recursive halving pairs ranks
#     0-1 and 2-3 first, so only a quarter of the buffer crosses hosts each way, twice: S per host
#     link, as much as the hierarchical leaders send; bound 1.0x), flat:ring dtrain's own ring
#     over all ranks (2(HL-1)/(HL) S = 1.5 S through each host link; the leaders' 2(H-1)/H S = S
#     is the least any allreduce across 2 hosts can send, so hier/ring <= 1.5 for 2 x 2).
#     DTRAIN_HIER_CHUNK / DTRAIN_HIER_LEADERS=2 try the chunk pipeline / 2 leaders per host.
# Prints the CPU, the kernel set, a table and one JSON line. Needs root, ip netns, mpirun and an
# MPI build (else exits 77 with the reason). Figures depend on the machine's load: say so.
#   bench/compress_cluster.sh [EPOCHS=3]      (RATE_TRAIN, RATE_COMM, DT, COMPRESSORS, MODEL, TARGET;
#                                              WIRE_STEPS, WIRE_CHECKS; PARTS=train, wire or comm
#                                              (comma-separated): only those parts)
set -u
cd "$(dirname "$0")/.."
EPOCHS=${1:-3} RATE_TRAIN=${RATE_TRAIN:-100mbit} RATE_COMM=${RATE_COMM:-1gbit} MODEL=${MODEL:-mlp} TARGET=${TARGET:-0.85}
DT=$(cd "$(dirname "${DT:-build/dtrain}")" && pwd)/$(basename "${DT:-build/dtrain}")
HOSTS="$PWD/scripts/netns-hosts"
# 2 emulated hosts for the rest of the script (exits 77 without root, ip or mpirun; torn down at
# the end, on failure or interrupt)
read -ra RATES <<<"$RATE_TRAIN"
[ -n "${NETNS_NAME:-}" ] || RATE=${RATES[0]} exec "$HOSTS" session dtb 2 bash "$0" "$@"
NAME=$NETNS_NAME T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mpi() {  # NP SLOTS CMD...
  local np=$1 slots=$2; shift 2
  "$HOSTS" mpirun "$slots,$slots" -np "$np" ${DTRAIN_HIER_CHUNK:+-x DTRAIN_HIER_CHUNK} \
    ${DTRAIN_HIER_LEADERS:+-x DTRAIN_HIER_LEADERS} "$@"
}
sent() { cat "/sys/class/net/$NAME-v1/statistics/rx_bytes"; }  # what host 1 sent into the bridge
rcvd() { cat "/sys/class/net/$NAME-v1/statistics/tx_bytes"; }  # what the bridge sent host 1
pkts() { cat "/sys/class/net/$NAME-v1/statistics/rx_packets"; }

cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)
kern=$("$DT" bench train --model mlp --seconds 0.2 2>/dev/null | grep -E '^# (openblas|onednn|cpu)' | tr '\n' ' ')
echo "# cpu: $cpu ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); other jobs share this machine)"
echo "# kernels: $kern"

PARTS=${PARTS:-train,wire,comm}
# bytes host 1 sent per step, start-up excluded exactly: two runs of WIRE_STEPS="A B" steps (both in
# epoch 1, so the same start-up, broadcast and final evaluation), the difference over B - A steps;
# veth bytes and packets (one Ethernet/IP/TCP header, 66 B with timestamps, per packet: tbf's 256 kB
# burst passes GSO packets whole) and host 1's TCP segments (/proc/net/snmp OutSegs: the MSS-sized
# frames a real NIC would send); WIRE_CHECKS="1 0" with and without dtrain's op check (DTRAIN_MPI_CHECK)
segs() { ip netns exec "$NAME-1" awk '$1 == "Tcp:" { if (!h) { for (i = 2; i <= NF; i++) if ($i == "OutSegs") k = i; h = 1 } else print $k }' /proc/net/snmp; }
wire_one() {  # COMPRESS STEPS CHECK -> "bytes packets segments"
  local b0 p0 s0
  b0=$(sent) p0=$(pkts) s0=$(segs)
  DTRAIN_MPI_CHECK=$3 mpi 2 1 -x DTRAIN_MPI_CHECK "$DT" train --data fashion-mnist --model "$MODEL" --max-steps "$2" --batch 32 \
    --optimizer adam --lr 0.001 --compress "$1" --quiet >"$T/wire.log" 2>&1 || { echo "FAIL: $1 $2 steps: $(tail -3 "$T/wire.log")" >&2; return 1; }
  echo "$(($(sent) - b0)) $(($(pkts) - p0)) $(($(segs) - s0))"
}
wires=()
# the model's tensors (names, shapes) for the stated bytes: a 1-step local run's checkpoint
"$DT" train --data fashion-mnist --model "$MODEL" --max-steps 1 --batch 8 --quiet --save "$T/shapes.st" >/dev/null 2>&1 ||
  { echo "FAIL: cannot build --model $MODEL"; exit 1; }
runs=()
for rt in "${RATES[@]}"; do
  [ "${PARTS#*train}" = "$PARTS" ] && break
  "$HOSTS" rate "$NAME" 2 "$rt" || exit 1
  for c in ${COMPRESSORS:-none topk:0.01 powersgd:2 powersgd:2:warmup=300}; do
    b0=$(sent) r0=$(rcvd) p0=$(pkts) f="$T/$rt-$c"
    : >"$f.jsonl"
    mpi 2 1 "$DT" train --data fashion-mnist --model "$MODEL" --epochs "$EPOCHS" --batch 32 --optimizer adam --lr 0.001 \
      --compress "$c" --quiet --metrics "$f.jsonl" >"$f.log" 2>&1 &
    job=$! e1=
    while kill -0 $job 2>/dev/null; do  # the counters when epoch 1 ends: the steps after it, without start-up
      [ -z "$e1" ] && [ -s "$f.jsonl" ] && e1="$(sent) $(rcvd) $(pkts)"
      sleep 0.2
    done
    wait $job || { echo "FAIL: $c at $rt: $(tail -3 "$f.log")"; exit 1; }
    set -- ${e1:-$b0 $r0 $p0}
    runs+=("$rt $c $(($(sent) - b0)) $(($(rcvd) - r0)) $(($(pkts) - p0)) $(($(sent) - $1)) $(($(rcvd) - $2)) $(($(pkts) - $3))")
  done
done
"$HOSTS" rate "$NAME" 2 "${RATES[0]}" || exit 1  # the bytes per step at the first rate
set -- ${WIRE_STEPS:-100 500}
wa=$1 wb=$2
for c in ${COMPRESSORS:-none topk:0.01 powersgd:2 powersgd:2:warmup=300}; do
  [ "${PARTS#*wire}" = "$PARTS" ] && break
  case $c in *warmup=*) continue ;; esac  # plain steps first: not one format per step
  for chk in ${WIRE_CHECKS:-1 0}; do
    a=$(wire_one "$c" "$wa" "$chk") && b=$(wire_one "$c" "$wb" "$chk") || exit 1
    wires+=("$c $chk $wa $a $wb $b")
  done
done
tsopt=$(ip netns exec "$NAME-1" cat /proc/sys/net/ipv4/tcp_timestamps)
"$HOSTS" rate "$NAME" 2 "$RATE_COMM" || exit 1
[ "${PARTS#*comm}" = "$PARTS" ] && : >"$T/comm.log" ||
mpi 4 2 "$DT" bench comm --backend mpi --colls allreduce --sizes 4M,16M,64M --allreduce flat,flat:ring,hier,flat,flat:ring,hier,flat,flat:ring,hier --trials 2 --iters 16 --no-mpi-baseline \
  >"$T/comm.log" 2>&1 || { echo "FAIL: bench comm: $(tail -3 "$T/comm.log")"; exit 1; }

python3 - "$T" "${RATES[0]}" "$RATE_COMM" "$cpu" "$MODEL" "$TARGET" "$tsopt" "${#runs[@]}" "${runs[@]}" "${wires[@]}" <<'PY'
import json, math, struct, sys
T, rate_train, rate_comm, cpu, model, target, tsopt, nruns = sys.argv[1:9]
target, nruns = float(target), int(nruns)
run_args, wire_args = sys.argv[9:9 + nruns], sys.argv[9 + nruns:]
HDR = 66 if tsopt.strip() != "0" else 54  # Ethernet 14 + IPv4 20 + TCP 20 (+ 12 timestamp option)
raw = open(T + "/shapes.st", "rb").read()
hdr = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
tensors = [(k, v["shape"]) for k, v in sorted(((k, v) for k, v in hdr.items() if k != "__metadata__" and
           not k.startswith("optim.")), key=lambda kv: kv[1]["data_offsets"][0])]
layers = []  # [(layer, [shapes])] in slab order; ddp's buckets: whole layers from the last, 1 MB cap
for k, shape in tensors:
    if not layers or layers[-1][0] != k.split(".")[0]: layers.append((k.split(".")[0], []))
    layers[-1][1].append(shape)
buckets, cur = [], []
for i, (_, shapes) in enumerate(reversed(layers)):
    cur += shapes
    if sum(math.prod(s) for s in cur) >= 262144 or i == len(layers) - 1: buckets.append(cur); cur = []
n = sum(math.prod(s) for b in buckets for s in b)
def stated(c):  # bytes per step and rank by the compressor's own formula, bucket by bucket
    if c == "none": return 4 * n
    if c.startswith("topk:"): return sum(8 * math.ceil(float(c[5:]) * sum(math.prod(s) for s in b) - 1e-9) for b in buckets)
    r = int(c.split(":")[1])
    def one(s):  # a matrix (first dimension by the rest) as P (n x r) and Q (m x r); else plain
        rows, cols = s[0], math.prod(s) // s[0]
        if len(s) >= 2 and rows > 1 and cols > 1: return (rows + cols) * min(r, rows, cols)
        return math.prod(s)
    return 4 * sum(one(s) for b in buckets for s in b)
rows, out = [], []
for arg in run_args:
    rt, c, veth, veth_in, veth_pkts, later, later_in, later_pkts = arg.split()
    recs = [json.loads(l) for l in open("%s/%s-%s.jsonl" % (T, rt, c))]
    hit = next((r for r in recs if r["test_acc"] >= target), None)
    steps = recs[-1]["step"]
    sync = recs[-1].get("sync", {})
    rows.append(dict(link=rt, compress=c, epochs=len(recs), time_to_target_s=hit["wall_s"] if hit else None,
                     epoch_at_target=hit["epoch"] if hit else None, final_acc=recs[-1]["test_acc"],
                     wall_s=recs[-1]["wall_s"], step_ms=sum(r["epoch_s"] for r in recs) / steps * 1e3,
                     bytes_counted=sync.get("bytes_per_step"), bytes_stated=stated(c),
                     veth_bytes_per_step=int(veth) / steps, veth_in_bytes_per_step=int(veth_in) / steps,
                     veth_packets_per_step=int(veth_pkts) / steps))
    if len(recs) > 1:  # after epoch 1: no start-up (MPI wire-up, the parameter broadcast, epoch 1's evaluation)
        s2 = steps - recs[0]["step"]
        rows[-1].update(later_veth_bytes_per_step=int(later) / s2, later_veth_in_bytes_per_step=int(later_in) / s2,
                        later_veth_packets_per_step=int(later_pkts) / s2)
bases = {}  # each link rate's first compressor: the baseline of its speedups
for r in rows: bases.setdefault(r["link"], r)
print("\n# 2 hosts x 1 rank, links %s (tbf), %s (%d parameters, %d buckets), batch 32/rank, Adam 1e-3, %d epochs"
      % (" / ".join(bases) or rate_train, model, n, len(buckets), rows[0]["epochs"] if rows else 0))
print("%-8s %-12s %10s %8s %9s %9s %12s %12s %12s %12s %9s %9s %9s" % ("link", "compress", "t(%g) s" % target, "epoch", "final acc",
      "step ms", "bytes/step", "stated", "veth B/step", "after ep.1", "veth/cnt", "counted/", "speedup"))
for r in rows:
    base = bases[r["link"]]
    sp = base["time_to_target_s"] / r["time_to_target_s"] if base["time_to_target_s"] and r["time_to_target_s"] else None
    r["speedup_to_target"] = sp
    r["counted_over_stated"] = r["bytes_counted"] / r["bytes_stated"] if r["bytes_counted"] else None
    later = r.get("later_veth_bytes_per_step", r["veth_bytes_per_step"])
    print("%-8s %-12s %10s %8s %9.4f %9.2f %12.0f %12.0f %12.0f %12.0f %9.3f %9.3f %9s" % (r["link"], r["compress"],
          "%.1f" % r["time_to_target_s"] if r["time_to_target_s"] else "-", r["epoch_at_target"] or "-", r["final_acc"],
          r["step_ms"], r["bytes_counted"] or 0, r["bytes_stated"], r["veth_bytes_per_step"], later,
          later / r["bytes_counted"] if r["bytes_counted"] else 0, r["counted_over_stated"] or 0, "%.2fx" % sp if sp else "-"))
wire = []
for arg in wire_args:
    c, chk, na, ba, pa, sa, nb, bb, pb, sb = arg.split()
    n_ = int(nb) - int(na)
    b, p, sg = (int(bb) - int(ba)) / n_, (int(pb) - int(pa)) / n_, (int(sb) - int(sa)) / n_
    st = stated(c.split(":warmup")[0]) if "warmup" not in c else None
    wire.append(dict(compress=c, check=chk == "1", steps=[int(na), int(nb)], veth_bytes_per_step=b, veth_packets_per_step=p,
                     tcp_segments_per_step=sg, tcp_payload_bytes_per_step=b - HDR * p, bytes_stated=st,
                     mtu_frame_bytes_per_step=b - HDR * p + HDR * sg))
if wire:
    nonef = {w["check"]: w for w in wire if w["compress"] == "none"}
    print("\n# bytes host 1 sent per step (start-up excluded: runs of %d and %d steps, the difference), links %s;"
          " TCP stream = veth - %d B x packets (what MPI wrote: payload, MPI headers, op checks, the stop vote);"
          " MTU frames = TCP stream + %d B x TCP segments (a real NIC at MTU 1500)" % (wire[0]["steps"][0], wire[0]["steps"][1], rate_train, HDR, HDR))
    print("%-24s %6s %10s %10s %9s %9s %10s %9s %11s %9s %8s %9s" % ("compress", "check", "stated", "TCP stream", "/stated",
          "veth", "/stated", "packets", "MTU frames", "/stated", "segments", "ratio err"))
    for w in wire:
        s_ = w["bytes_stated"]
        base = nonef.get(w["check"])
        # the compression ratio on the wire (uncompressed veth bytes / these) against the stated one
        if s_ and base: w["veth_ratio_over_stated_ratio"] = (base["veth_bytes_per_step"] / w["veth_bytes_per_step"]) / (4 * n / s_)
        print("%-24s %6s %10s %10.0f %9s %9.0f %10s %9.2f %11.0f %9s %8.2f %9s" % (w["compress"], "on" if w["check"] else "off",
              "%d" % s_ if s_ else "-", w["tcp_payload_bytes_per_step"], "%+.1f%%" % (100 * (w["tcp_payload_bytes_per_step"] / s_ - 1)) if s_ else "-",
              w["veth_bytes_per_step"], "%+.1f%%" % (100 * (w["veth_bytes_per_step"] / s_ - 1)) if s_ else "-", w["veth_packets_per_step"],
              w["mtu_frame_bytes_per_step"], "%+.1f%%" % (100 * (w["mtu_frame_bytes_per_step"] / s_ - 1)) if s_ else "-",
              w["tcp_segments_per_step"], "%+.1f%%" % (100 * (1 / w["veth_ratio_over_stated_ratio"] - 1)) if "veth_ratio_over_stated_ratio" in w else "-"))
res = {}
for line in open(T + "/comm.log"):
    if line.startswith("{"):
        for x in json.loads(line)["results"]:
            if x["backend"] == "mpi":  # best of the interleaved repeats
                d = res.setdefault(x["bytes"], {})
                d[x["algo"]] = max(d.get(x["algo"], 0), x["busbw_gbs"])
print("\n# 2 hosts x 2 ranks, links %s (tbf): allreduce busbw (GB/s), f32 sum, MPI transport" % rate_comm)
link = {"gbit": 1e9, "mbit": 1e6}[rate_comm[-4:]] * float(rate_comm[:-4]) / 8 / 1e9  # GB/s
print("%12s %10s %10s %10s %9s %9s %8s   (bounds 1.0x, 1.5x; line rate: flat %.4f, ring %.4f, hier %.4f GB/s busbw)" % (
      "bytes", "flat", "ring", "hier", "hier/flat", "hier/ring", "of line", 1.5 * link, link, 1.5 * link))
hier = []
for b in sorted(res):
    f, r, h = res[b].get("auto"), res[b].get("auto:ring"), res[b].get("hier")
    hier.append(dict(bytes=b, flat_busbw_gbs=f, ring_busbw_gbs=r, hier_busbw_gbs=h, ratio=h / f if f and h else None,
                     ratio_ring=h / r if r and h else None))
    print("%12d %10.4f %10.4f %10.4f %8.2fx %8.2fx %7.0f%%" % (b, f or 0, r or 0, h or 0, h / f if f and h else 0,
          h / r if r and h else 0, 100 * (h or 0) / (1.5 * link)))
print(json.dumps(dict(bench="compress_cluster", cpu=cpu, model=model, target_acc=target, rate_train=rate_train, rate_comm=rate_comm, runs=rows,
                      wire=wire, hier=hier)))
PY
