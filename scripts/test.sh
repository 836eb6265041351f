#!/usr/bin/env bash
# Sets the machine up (scripts/setup.sh) and runs the whole test suite. Extra args go to pytest.
# pytest's exit code 5 (no tests collected) is a failure here, not a pass.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh" || exit $?
cd "$ROOT" || exit 1
.venv/bin/python -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests; treating that as a failure" >&2
  exit 1
fi
exit "$rc"
