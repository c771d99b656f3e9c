# `dtrain bench train` compares like with like: both sides train on real data (Fashion-MNIST
# images, King James Bible windows), the very same batches (dtrain hands PyTorch its bytes in a
# file), each pinned to one CPU, and the JSON line says so. PyTorch's side runs where Debian's
# python3-torch is installed; the figures themselves are the bench's output, never checked here.
. "$(dirname "$0")/testlib.bash"
have_fmnist || { echo "skip: Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export DTRAIN_ROOT=$ROOT

out=$($DT bench train --seconds 0 --model mlp --batch 32 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "# mlp b32 data: fashion-mnist, 64 batches of 32 drawn from 60000 images" <<<"$out" \
  && grep -q '"data": "real"' <<<"$out" && ok "bench train: the MLP trains on Fashion-MNIST" || bad "bench train mlp (exit $rc): $out"
cpu=$(sed -n 's/.*"cpu": \(-\?[0-9]*\),.*/\1/p' <<<"$out")
[ -n "$cpu" ] && [ "$cpu" -ge 0 ] && grep -q "both sides pinned to CPU $cpu" <<<"$out" \
  && ok "bench train --threads 1 pins itself (CPU $cpu)" || bad "bench train is not pinned: $out"
last=$(($(nproc) - 1))
out=$($DT bench train --seconds 0 --model mlp --batch 32 --cpu $last 2>&1)
grep -q "both sides pinned to CPU $last" <<<"$out" && grep -q "\"cpu\": $last," <<<"$out" \
  && ok "bench train --cpu $last pins there" || bad "bench train --cpu $last: $out"
out=$($DT bench train --seconds 0 --model mlp --batch 32 --cpu -1 2>&1)
grep -q "not pinned" <<<"$out" && ok "bench train --cpu -1: not pinned" || bad "bench train --cpu -1: $out"
expect_fail "bench train --cpu out of range" "--cpu 99999: give a CPU number below" $DT bench train --seconds 0 --cpu 99999

out=$($DT bench train --seconds 0 --model gpt 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "# gpt b12 data: kjv, 64 batches of 12 drawn from" <<<"$out" \
  && ok "bench train: the GPT trains on the King James Bible" || bad "bench train gpt (exit $rc): $out"

if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  for m in "mlp --batch 32" "gpt"; do
    out=$($DT bench train --seconds 0 --model $m --vs-torch 2>&1); rc=$?
    t=$(sed -n 's/.*"torch_samples_per_s": \([0-9.]*\), "torch_samples_per_cpu_s": \([0-9.]*\)}.*/\1 \2/p' <<<"$out" | head -1)
    awk -v t="$t" 'BEGIN { split(t, a, " "); exit !(a[1] > 0 && a[2] > 0) }' \
      && ok "bench train --vs-torch ($m): PyTorch trained on dtrain's batches ($t samples/s, per cpu-s)" \
      || bad "bench train --vs-torch ($m) has no PyTorch rate (exit $rc): $out"
  done
  # the PyTorch side refuses a data file that is not the bench's
  head -c 1000 /dev/zero >"$TMP/short.bin"
  expect_fail "train_torch.py names a wrong-sized data file" "holds 1000 bytes, expected" \
    /usr/bin/python3 "$ROOT/bench/train_torch.py" --model mlp --batch 32 --data "$TMP/short.bin" --seconds 0
else
  echo "note: python3-torch not installed: the --vs-torch checks are skipped"
fi
finish
