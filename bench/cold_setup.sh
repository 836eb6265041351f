#!/usr/bin/env bash
# Cold set-up time: scripts/setup.sh into an empty cache (no shared venv, no converted model) with
# pip's download cache off, then the sandbox image rebuilt from debootstrap (--force). Prints one
# JSON line: seconds for the venv + model, for the image, and the total.
#
#   bash bench/cold_setup.sh | tee bench/results/cold_setup.log
#
# The clone's .venv is repointed at the regular cache again afterwards.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COLD=$(mktemp -d /tmp/pqrl-cold-XXXX)
trap 'rm -rf "$COLD"; PQRL_SKIP="apt docker image model" bash "$ROOT/scripts/setup.sh" >/dev/null 2>&1' EXIT

echo "# commit $(git -C "$ROOT" rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
t0=$(date +%s.%N)
PQRL_CACHE="$COLD" PIP_NO_CACHE_DIR=1 PQRL_SKIP="apt docker image" bash "$ROOT/scripts/setup.sh" 2>&1 \
  | grep '^\[setup' >&2
t1=$(date +%s.%N)
image_s=null
if docker info >/dev/null 2>&1; then
  "$ROOT/.venv/bin/pqrl" sandbox build-image --force >&2
  image_s=$(python3 -c "print(round($(date +%s.%N) - $t1, 1))")
fi
python3 -c "
v = round($t1 - $t0, 1)
i = None if '$image_s' == 'null' else float('$image_s')
print('{\"venv_and_model_s\": %s, \"image_s\": %s, \"total_s\": %s, \"pip_cache\": false}'
      % (v, 'null' if i is None else i, round(v + (i or 0), 1)))
"
