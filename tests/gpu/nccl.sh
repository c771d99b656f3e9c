# GPU check of the NCCL transport, a section of `make test-gpu` (hook: `bash tests/gpu/nccl.sh BUILD`
# from that target; exit 77 = skipped). Needs a build with NCCL=1 and a GPU with its driver.
#  1. build/tests/transport_nccl_test: every collective and grouped device send/recv on cudaMalloc'ed
#     buffers against host-computed values, the in-place forms, host buffers via the bootstrap. Ranks:
#     2 with 2+ GPUs (one per GPU; then also a rank that skips an allreduce: the other times out by its
#     deadline), else 1: NCCL cannot run two ranks on one GPU, so on one GPU the 2-rank cases do not run.
#  2. With 2+ GPUs and a dtrain whose --device takes cuda: `dtrain train --workers 2 --device cuda`
#     chooses nccl by itself and trains (the CUDA device's own tests check the numbers).
. "$(dirname "$0")/../testlib.bash"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -lt 1 ]; then echo "skip: no GPU here (nvidia-smi -L lists none)"; exit 77; fi
if ! ldd "$DT" | grep -q libnccl; then bad "$DT is built without NCCL: rebuild with make NCCL=1"; finish; exit; fi
echo "nccl: $gpus GPU(s): $([ "$gpus" -ge 2 ] && echo "2 ranks, one per GPU" || echo "1 rank (NCCL cannot run two ranks on one GPU; the 2-rank cases are not run)")"
if out=$(timeout 300 "$BUILD/tests/transport_nccl_test" 2>&1); then
  ok "transport_nccl_test: $(echo "$out" | tail -1)"
else
  bad "transport_nccl_test failed: $out"
fi
if [ "$gpus" -ge 2 ] && "$DT" train --help 2>&1 | grep -q 'cuda'; then
  if timeout 300 "$DT" train --workers 2 --device cuda --model mlp --epochs 1 --max-steps 20 --batch 64 \
       >"$TMP/train.log" 2>&1 && grep -q "2 ranks over nccl" "$TMP/train.log"; then
    ok "dtrain train --workers 2 --device cuda chose nccl and trained 20 steps"
  else
    bad "2 workers on --device cuda: $(tail -5 "$TMP/train.log")"
  fi
fi
finish
