#!/usr/bin/env bash
# Here, before a call on a lent machine: the wheels it lacks, into a folder the call carries.
#
#   bash benchmarks/device/wheels.sh        # tpu: the TPU v5e machine (Python 3.11, its own
#                                           # package index): what that index lacks, into .whl-tpu/
#   bash benchmarks/device/wheels.sh gpu    # the NVIDIA GPU machine (Python 3.12, JAX 0.11 with
#                                           # CUDA, no index): zoo's libraries at CI's versions, into .whl-gpu/
#
# Both folders are ignored by git (3.5 MB and 6.6 MB); the call names its folder in `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
kind=${1:-tpu}
case "$kind" in
  tpu) python=3.11
    wheels=(equinox==0.13.8 chex==0.1.92 dm-tree==0.1.10 dp-accounting==0.6.0 jax-privacy==2.0.0
      pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5) ;;
  gpu) python=3.12  # the image has the rest (tensorstore, tokenizers, safetensors, rich, ...)
    wheels=(flax==0.12.12 optax==0.2.8 orbax-checkpoint==0.12.8 equinox==0.13.8 chex==0.1.92
      dm-tree==0.1.10 dp-accounting==0.6.0 jax-privacy==2.0.0 datasets==5.2.0 dill==0.4.1
      multiprocess==0.70.19 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
      typing-inspection==0.4.5) ;;
  *) echo "wheels.sh: unknown machine '$kind'; valid: tpu, gpu" >&2; exit 2 ;;
esac
folder=.whl-$kind
grep -qx "/$folder/" .git/info/exclude 2>/dev/null || echo "/$folder/" >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$folder" "${wheels[@]}"
ls "$folder"
