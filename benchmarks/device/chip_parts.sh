#!/usr/bin/env bash
# Measurements that only a chip makes, in parts that each fit one device call (10 minutes), run
# after tpu.sh's set-up; each part is named by what it measures:
#
#   bash benchmarks/device/tpu.sh -- bash benchmarks/device/chip_parts.sh host-update       # llama-1b full AdamW with the update on the host: the serial step at 128 and 64 rows, the pipelined at 128
#   bash benchmarks/device/tpu.sh -- bash benchmarks/device/chip_parts.sh dp-methods        # DP clipping methods side by side at 256 x 8 and 1024 x 8
#   bash benchmarks/device/tpu.sh -- bash benchmarks/device/chip_parts.sh dp-acceptance     # issue 65's acceptance at B 8: GPT-2 at 1024 x 8 and 256 x 8, the noise
#   bash benchmarks/device/tpu.sh -- bash benchmarks/device/chip_parts.sh dp-acceptance-batches  # the rest: a logical batch of 1,024 x 1,024 tokens, DP-LoRA of llama-1b
#   bash benchmarks/device/tpu.sh -- bash benchmarks/device/chip_parts.sh dp-logical-batch  # ghost DP on a logical batch of 1,024 x 1,024 tokens, microbatches of 8
#   bash benchmarks/device/tpu.sh -- bash benchmarks/device/chip_parts.sh dp-lora           # DP-LoRA of llama-1b at 1,024 x 1,024 tokens
#   bash benchmarks/device/tpu.sh -- bash benchmarks/device/chip_parts.sh fits-table        # the largest batch of gpt2-355m per remat policy, llama-1b with frozen layers
#   bash benchmarks/device/tpu.sh -- bash benchmarks/device/chip_parts.sh first-look        # a chip not measured before: the GPT-2 step beside plain JAX, ghost DP beside jax_privacy, decode
#
# Each command runs under `timeout`, prints as it goes, and writes its JSON under $OUT (default
# /tmp/out). `SMALL=1` runs every part at a tiny size on a CPU (the same flags otherwise).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PY=${PY:-python3}
ZOO=("$PY" -c 'import sys; from zoo.cli import main; sys.exit(main(sys.argv[1:]))')  # zoo, uninstalled
step() {  # step NAME SECONDS CMD...: one bounded command, its output kept in $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most $limit s): $*"
  local tic=$(date +%s)
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | grep --line-buffered -v '^dp bench: timing round'
  echo "== $name: exit ${PIPESTATUS[0]} after $(( $(date +%s) - tic )) s"
}
if [ "${SMALL:-}" = 1 ]; then
  GPT=transformer-xs; LLAMA=llama-xs; S256=16; S1024=16; LOGICAL=64; SMALL_FLAG=--small; LORA_BATCH=16
  NORMALS=100000; QUICK=(--rounds 1 --steps 1); NOISE_QUICK=(--rounds 3 --calls 2); FLOOR=()
else
  GPT=gpt2-124m; LLAMA=llama-1b; S256=256; S1024=1024; LOGICAL=1024; SMALL_FLAG=; LORA_BATCH=64
  NORMALS=124439808; QUICK=(); NOISE_QUICK=(); FLOOR=(--ram-floor-gib 4 --ram-trail-gib 2)
fi
BF=(--precision bfloat16 --no-sweep --json)
case "${1:-}" in
host-update)
  # zoo train's serial step (its params up in pieces now) at 128 and 64 rows, the acceptance's
  # two shapes, then the pipelined exact step at 128, each under the step's default host budgets,
  # with its host RSS peak and the budget's, and a line each time the RAM available moves 2 GiB.
  # (2026-12-08, thirteenth: serial 27.77 s at 128 rows with the whole tree up in one copy, 5.19 s
  # of it; the pipelined exact 32.60 s, the delayed at 64 rows 22.79 s: the leaves' updates
  # were the pipeline's loss. A row takes 75-140 s here.)
  step host_update 520 "$PY" benchmarks/device/host_update.py --preset "$LLAMA" --seq 2048 $SMALL_FLAG \
    --rows full:4:32:serial,full:4:16:serial,full:4:32 --steps 1 --json "$OUT/host_update.json" "${FLOOR[@]}"
  ;;
dp-methods)
  step dp_256x8 240 "${ZOO[@]}" bench dp "$GPT" --seq "$S256" --batch 8 "${BF[@]}" --forms measure \
    --methods "ghost,ghost bookkeeping,zoo vmap,jax_privacy clipped_grad"
  step dp_1024x8_ghost 180 "${ZOO[@]}" bench dp "$GPT" --seq "$S1024" --batch 8 "${BF[@]}" --remat dots --forms measure \
    --methods "ghost,ghost bookkeeping"
  step dp_1024x8_vmap 150 "${ZOO[@]}" bench dp "$GPT" --seq "$S1024" --batch 8 "${BF[@]}" --remat dots \
    --methods "zoo vmap,jax_privacy clipped_grad"
  ;;
dp-acceptance)
  # issue 65's rows at B 8, the headline first, with the noise's cost. On the chip (2026-12-08)
  # a row compiled in 10.5-26.7 s and each process took about 10 s to start, so the rows of
  # the whole acceptance need about 12 minutes: this part holds the B 8 tables (about 6.5),
  # dp-acceptance-batches the logical batch and DP-LoRA. auto's ghost row names the method it
  # ran; the second backward has its own row at 1024 x 8; jax_privacy's row is beside both.
  G=(--methods "ghost,ghost backward,ghost layer-wise,jax_privacy clipped_grad" --rounds 5)
  step dp_1024x8 190 "${ZOO[@]}" bench dp "$GPT" --seq "$S1024" --batch 8 "${BF[@]}" --remat dots "${G[@]}" "${QUICK[@]}"
  step dp_256x8 160 "${ZOO[@]}" bench dp "$GPT" --seq "$S256" --batch 8 "${BF[@]}" --rounds 5 \
    --methods "ghost,ghost layer-wise,jax_privacy clipped_grad" "${QUICK[@]}"
  step noise_normals 60 "$PY" benchmarks/dp/noise.py --normals "$NORMALS" "${NOISE_QUICK[@]}"
  ;;
dp-acceptance-batches)
  # issue 65's two rows of many microbatches, one step each: GPT-2 at 1,024 x 1,024 tokens in
  # microbatches of 8 (each row about 40 s of compiles and two steps of 10-13 s), and DP-LoRA of
  # llama-1b on 64 sequences of 1,024 tokens (8 microbatches of 8): the same program as the
  # 1,024-sequence logical batch, scanned over 8 microbatches, not 128 (a 1M-token step takes
  # about a minute a row on one chip; dp-lora runs it)
  step dp_logical 170 "${ZOO[@]}" bench dp "$GPT" --seq "$S1024" --batch "$LOGICAL" --microbatch 8 "${BF[@]}" \
    --remat dots --methods ghost --rounds 1 --steps 1
  step dp_lora 190 "$PY" benchmarks/device/dp_lora.py --preset "$LLAMA" --seq "$S1024" --batch "$LORA_BATCH" \
    --microbatch 8 --remat full $SMALL_FLAG
  ;;
dp-logical-batch)
  step dp_logical 420 "${ZOO[@]}" bench dp "$GPT" --seq "$S1024" --batch "$LOGICAL" --microbatch 8 "${BF[@]}" --remat dots \
    --methods ghost --rounds 2 --steps 1
  ;;
dp-lora)
  step dp_lora 540 "$PY" benchmarks/device/dp_lora.py --preset "$LLAMA" --seq "$S1024" --batch "$LOGICAL" \
    --microbatch 8 --remat full $SMALL_FLAG
  ;;
fits-table)
  # the rows still open (2026-12-07, ninth: gpt2-355m none, dots and minimal, and the frozen-layer
  # llama-1b measured; a row's batch search is 150-240 s, so a call holds two, a third if time is left)
  rows=gpt2-355m:full:none,gpt2-355m:offload-layer-input:none,gpt2-355m:full:optimizer+params
  step fits 560 "$PY" benchmarks/device/fits_table.py --seq 2048 --steps 2 --deadline 330 $SMALL_FLAG \
    --json "$OUT/fits.json" --plot "$OUT/fits.png" --rows "$rows"
  ;;
first-look)
  # one call's worth on a chip seen for the first time (the NVIDIA GPU machine's first lease):
  # zoo's GPT-2 step beside the plain-JAX one in every attention the chip has (splash on a TPU;
  # cuDNN's and the einsum form elsewhere), issue 65's headline DP rows beside jax_privacy, and
  # decode against the roofline
  if [ "$("$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null)" = tpu ]; then
    ROWS=(--zoo splash:dots,splash:none --plain splash:dots,splash:none)
  else
    ROWS=(--zoo dense:dots,cudnn:dots,cudnn:none --plain sdpa:dots,sdpa:none,xla:dots)
  fi
  if [ "${SMALL:-}" = 1 ]; then MFU=(--small); else MFU=(--batch 16 --rounds 3 --steps 5); fi
  step mfu 180 "$PY" benchmarks/device/mfu.py "${MFU[@]}" "${ROWS[@]}" --json "$OUT/mfu.json"
  step dp_1024x8 150 "${ZOO[@]}" bench dp "$GPT" --seq "$S1024" --batch 8 "${BF[@]}" --remat dots --rounds 3 \
    --methods "ghost,ghost layer-wise,jax_privacy clipped_grad" "${QUICK[@]}"
  step dp_256x8 120 "${ZOO[@]}" bench dp "$GPT" --seq "$S256" --batch 8 "${BF[@]}" --rounds 3 \
    --methods "ghost,ghost layer-wise,jax_privacy clipped_grad" "${QUICK[@]}"
  step decode 90 "$PY" benchmarks/device/decode.py --models "$GPT" --batches 1,64 $SMALL_FLAG --json "$OUT/decode.json"
  ;;
*)
  echo "usage: chip_parts.sh host-update|dp-methods|dp-acceptance|dp-acceptance-batches|dp-logical-batch|dp-lora|fits-table|first-look" >&2
  exit 2
  ;;
esac
