#!/usr/bin/env bash
# Sets the machine up (scripts/setup.sh) and runs the whole test suite. Extra args go to pytest.
# pytest's exit code 5 (no tests collected) is a failure here, not a pass.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh" || exit $?
cd "$ROOT" || exit 1
# The suite saves model checkpoints (~0.5 GB each) under the temp dir; say so before a full disk
# turns into hundreds of unrelated errors.
tmp=${TMPDIR:-/tmp}
free_gb=$(df -Pk "$tmp" | awk 'NR==2 {print int($4 / 1048576)}')
if [ "${free_gb:-0}" -lt 15 ]; then
  echo "scripts/test.sh: WARNING: only ${free_gb} GB free in $tmp; the suite needs about 15 GB" >&2
fi
.venv/bin/python -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests; treating that as a failure" >&2
  exit 1
fi
exit "$rc"
