# Architecture check (DESIGN.md "Layers of the system"): a lower layer never includes a higher
# one. Each src/<layer> may include only the internal and public headers of layers below it.
. "$(dirname "$0")/testlib.bash"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# layer: forbidden include prefixes (internal dirs and the public headers that belong to them)
declare -A FORBID=(
  [core]="backend/ device/ models/ comm/ nn/ optim/ data/ parallel/ run/ cli/ dtrain/comm.h dtrain/nn.h dtrain/optim.h dtrain/data.h dtrain/train.h dtrain/safetensors.h"
  [device]="nn/ models/ comm/ optim/ data/ parallel/ run/ cli/ fl/ dtrain/nn.h dtrain/models.h dtrain/comm.h dtrain/data.h dtrain/train.h"
  [backend]="device/ nn/ models/ comm/ optim/ data/ parallel/ run/ cli/ dtrain/nn.h dtrain/models.h dtrain/comm.h dtrain/data.h dtrain/train.h"
  [comm]="backend/ models/ nn/ optim/ data/ parallel/ run/ cli/ dtrain/nn.h dtrain/optim.h dtrain/data.h dtrain/train.h"
  [nn]="models/ comm/ data/ parallel/ run/ cli/ dtrain/comm.h dtrain/data.h dtrain/train.h"
  [models]="comm/ data/ parallel/ run/ cli/ dtrain/comm.h dtrain/data.h dtrain/train.h"
  [optim]="backend/ models/ nn/ comm/ data/ parallel/ run/ cli/ dtrain/comm.h dtrain/data.h dtrain/train.h"
  [data]="backend/ models/ comm/ nn/ optim/ parallel/ run/ cli/ dtrain/comm.h dtrain/nn.h dtrain/train.h"
  [parallel]="run/ cli/ dtrain/train.h"
  [plan]="run/ cli/"  # the planner: between run/ and parallel/ (uses the public memory plan)
  [run]="cli/"
  [fl]="cli/ parallel/ comm/ dtrain/comm.h"  # federated learning: beside parallel/ and run/ (uses run/checkpoint)
  [cli]="comm/ core/ nn/ optim/ data/ parallel/"  # the CLI uses the public API (and run/'s launcher)
)
for layer in "${!FORBID[@]}"; do
  for f in "$ROOT"/src/"$layer"/*.[ch]; do
    case "$f" in *_test.c | *_testlib.h) continue ;; esac  # tests drive a layer from above
    for bad in ${FORBID[$layer]}; do
      if grep -q "^#include \"$bad" "$f"; then bad "$(basename "$f") (layer $layer) includes $bad"; fi
    done
  done
done
[ $fails -eq 0 ] && ok "no layer includes a higher one"
finish
