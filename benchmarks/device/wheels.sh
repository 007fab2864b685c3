#!/usr/bin/env bash
# Here, before a call on the lent TPU machine: the wheels that machine's own package index lacks
# (equinox, chex, dm-tree, dp-accounting, jax-privacy and pydantic's), for its Python 3.11, into
# .whl-tpu/ (ignored by git; about 3.5 MB). The call then names .whl-tpu in `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl-tpu/' .git/info/exclude 2>/dev/null || echo /.whl-tpu/ >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl-tpu \
  equinox==0.13.8 chex==0.1.92 dm-tree==0.1.10 dp-accounting==0.6.0 jax-privacy==2.0.0 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
ls .whl-tpu
