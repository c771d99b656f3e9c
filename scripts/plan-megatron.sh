#!/usr/bin/env bash
# The planner at paper scale: Megatron-LM's GPT weak-scaling runs (Narayanan et al., "Efficient
# Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21, Table 1: DGX A100
# nodes, 8 GPUs each, 8 HDR InfiniBand NICs; fp16; sequence 2048, vocabulary 51200) planned on
# examples/clusters/dgx-a100.json. Per row: the published layout's predicted step time (dtrain plan
# with --tp/--pp fixed, memory not limited: dtrain's own memory model has no activation
# recomputation) beside the published one (the paper's FLOPs per iteration with recomputation,
# 96 B s l h^2 (1 + s/6h + V/16lh), over its measured TFLOP/s per GPU x GPUs), and the layout the
# planner chooses itself under 80 GB per rank. Usage: scripts/plan-megatron.sh [BUILD]
set -u
DT=${1:-build}/dtrain
CL=$(dirname "$0")/../examples/clusters/dgx-a100.json
printf '%-7s %5s %4s %4s %5s %7s | %10s %10s %7s | %s\n' params gpus tp pp batch tflops pub_s pred_s ratio \
  "planner's own choice under 80 GB (predicted s)"
# params(B) heads hidden layers tp pp gpus batch tflops/gpu
while read -r P A H L TP PP N B TF; do
  G="gpt:L=$L,H=$A,C=$H,T=2048,V=51200"
  pub=$(python3 -c "s,V=2048,51200; F=96*$B*s*$L*$H**2*(1+s/(6*$H)+V/(16*$L*$H)); print('%.2f'%(F/($TF*1e12*$N)))")
  js=$($DT plan --model "$G" --data kjv --batch "$B" --cluster "$CL" --hosts $((N / 8)) --precision fp16 \
       --tp "$TP" --pp "$PP" --mem-limit 1000000G --json --top 1)
  pred=$(python3 -c "import json,sys; print('%.2f'%json.load(sys.stdin)['layouts'][0]['step_s'])" <<<"$js")
  own=$($DT plan --model "$G" --data kjv --batch "$B" --cluster "$CL" --hosts $((N / 8)) --precision fp16 --json \
        --top 1 | python3 -c "import json,sys; d=json.load(sys.stdin); l=[x for x in d['layouts'] if x['fits']]
print('%s (%.2f)'%(l[0]['layout'],l[0]['step_s']) if l else 'nothing fits 80 GB (dtrain keeps every activation): the least needs %.0f GB'%(d['least_mem_bytes']/1e9))")
  printf '%-7s %5d %4d %4d %5d %7d | %10s %10s %7s | %s\n' "${P}B" "$N" "$TP" "$PP" "$B" "$TF" "$pub" "$pred" \
    "$(python3 -c "print('%.2f'%($pred/$pub))")" "$own"
done <<'ROWS'
1.7 24 2304 24 1 1 32 512 137
3.6 32 3072 30 2 1 64 512 138
7.5 32 4096 36 4 1 128 512 142
18.4 48 6144 40 8 1 256 1024 135
39.1 64 8192 48 8 2 512 1536 138
76.1 80 10240 60 8 4 1024 1792 140
145.6 96 12288 80 8 8 1536 2304 148
310.1 128 16384 96 8 16 1920 2160 155
529.6 128 20480 105 8 35 2520 2520 163
1008.0 160 25600 128 8 64 3072 3072 163
ROWS
