#!/usr/bin/env bash
# One prepared call on the lent machine: set zoo up beside the machine's own JAX, then run
# the command given after `--` (default: the MFU benchmark), timing both parts.
#
#   bash benchmarks/device/tpu.sh -- python3 benchmarks/device/mfu.py --json "$OUT/mfu.json"
#
# Named for the TPU v5e machine it was written for; the NVIDIA GPU machine takes it too.
# - The TPU machine: Python 3.11, JAX (0.10.2 when this was written) on PYTHONPATH, its own
#   package index at /opt/pypi/simple, and no internet. What its index lacks travels as wheels
#   in .whl-tpu/ (benchmarks/device/wheels.sh, here; the call's `carry`). Everything installs
#   under /tmp/site, appended to PYTHONPATH, so that the machine's JAX stays first.
# - The GPU machine: Python 3.12 in a virtual environment with JAX and its CUDA plugin, most of
#   zoo's libraries, and no index. zoo's own versions travel in .whl-gpu/ (`wheels.sh gpu`),
#   install under /tmp/site, and come first on PYTHONPATH (they hold no JAX). The carried
#   folder says which machine this is: .whl-gpu/ takes this way.
# zoo itself runs from the checkout (PYTHONPATH), with no install.
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
SITE=/tmp/site
# The checkout's .python-version asks pyenv for 3.12; the machine's JAX is built for its own Python.
export PYENV_VERSION=system
PY=$(for p in python3.11 /usr/bin/python3 python3; do command -v "$p" >/dev/null && "$p" -c 'import jax' 2>/dev/null && echo "$p" && break; done)
[ -n "$PY" ] || { echo "tpu.sh: no Python here imports jax"; exit 2; }
PY=$("$PY" -c 'import sys; print(sys.executable)')
unset PYENV_VERSION
# `python3` is that Python for the command: a script, not a link (a link to a virtual
# environment's python outside its folder loses the environment's packages)
mkdir -p /tmp/pybin && printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" > /tmp/pybin/python3 && chmod +x /tmp/pybin/python3
export PATH="/tmp/pybin:$PATH"
mkdir -p "$SITE"
pip_in() { PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --isolated -q --no-cache-dir --disable-pip-version-check --target "$SITE" "$@"; }
index=(--only-binary=:all: --index-url file:///opt/pypi/simple)
GPU=$(ls .whl-gpu/*.whl 2>/dev/null | head -n 1)
if [ -n "$GPU" ]; then  # the GPU machine: the carried wheels alone, first on the path
  if [ -f "$SITE/.zoo-ready" ]; then echo "tpu.sh: $SITE is set up already (a warm machine)"; else
    pip_in --no-index --no-deps --no-compile .whl-gpu/*.whl && touch "$SITE/.zoo-ready"
  fi
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
elif [ -f "$SITE/.zoo-ready" ]; then echo "tpu.sh: $SITE is set up already (a warm machine)"; else
# 1. the carried wheels, as they are
pip_in --no-index --no-deps --no-compile .whl-tpu/*.whl || for wheel in .whl-tpu/*.whl; do
  pip_in --no-index --no-deps --no-compile "$wheel" 2>/dev/null || echo "tpu.sh: not installed: $wheel"
done
# 2. from the machine's index: packages that need JAX, without their dependencies (the
#    machine's JAX stays the one), then the rest with theirs; one by one where a name is missing
pip_in "${index[@]}" --no-deps flax optax orbax-checkpoint || echo "tpu.sh: flax/optax/orbax did not all install"
rest=(datasets tensorboard tokenizers safetensors rich scikit-learn matplotlib tensorstore msgpack treescope
  "etils[epath,epy]" pyyaml absl-py toolz jaxtyping wadler-lindig humanize protobuf nest_asyncio aiofiles
  simplejson attrs wrapt mpmath typing_extensions zstandard psutil tqdm)
if ! pip_in "${index[@]}" "${rest[@]}" 2>/tmp/pip.err; then
  echo "tpu.sh: one install of all failed ($(tail -n 1 /tmp/pip.err)); one at a time:"
  for name in "${rest[@]}"; do pip_in "${index[@]}" "$name" 2>/dev/null || echo "  not installed: $name"; done
fi
# what pip brought along that the machine has already: the machine's own stays
rm -rf "$SITE"/jax "$SITE"/jaxlib "$SITE"/jax-* "$SITE"/jaxlib-* "$SITE"/libtpu* "$SITE"/numpy "$SITE"/numpy-* \
  "$SITE"/numpy.libs "$SITE"/scipy "$SITE"/scipy-* "$SITE"/scipy.libs "$SITE"/ml_dtypes "$SITE"/ml_dtypes-*
touch "$SITE/.zoo-ready"
fi
[ -z "$GPU" ] && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE:$PWD"
export PYTHONUNBUFFERED=1
"$PY" - <<'PY' || { echo "tpu.sh: zoo does not import"; exit 2; }
import jax, zoo, zoo.cli, zoo.bench.step  # noqa
print(f"tpu.sh: jax {jax.__version__} on {jax.devices()[0].device_kind} x{jax.device_count()}, zoo from {zoo.__file__}")
PY
echo "tpu.sh: set-up took $(( $(date +%s) - start )) s"
shift_to_command() { while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done; [ $# -gt 0 ] && shift; printf '%s\0' "$@"; }
if [ "$#" -eq 0 ]; then
  set -- "$PY" benchmarks/device/mfu.py
else
  mapfile -d '' cmd < <(shift_to_command "$@")
  set -- "${cmd[@]}"
fi
run_start=$(date +%s)
# The host's RAM guarded: a command that runs it out loses the machine and all its output;
# the guard kills its largest process first (benchmarks/device/ram_guard.py), and says so.
"$@" &
command_pid=$!
"$PY" benchmarks/device/ram_guard.py --root "$command_pid" --floor-mib "${RAM_FLOOR_MIB:-3072}" &
guard_pid=$!
wait "$command_pid"
status=$?
kill -TERM "$guard_pid" 2>/dev/null
wait "$guard_pid" 2>/dev/null
echo "tpu.sh: the command took $(( $(date +%s) - run_start )) s; the call $(( $(date +%s) - start )) s in all (exit $status)"
exit $status
