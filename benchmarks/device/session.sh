#!/usr/bin/env bash
# A user's session on the chip (a TPU, or an NVIDIA GPU), as one prepared device call, after
# tpu.sh's set-up:
#
#   bash benchmarks/device/tpu.sh -- bash benchmarks/device/session.sh
#
# Every step is the CLI as a user types it (zoo tokenize, train, eval, sample, import), each under
# `timeout`, its whole output in a log; a failed step is reported and the rest still run (the
# exit status is 1 if any failed). In order (PARTS selects and orders the parts after `inputs`):
#   inputs   a corpus made offline (this Python's standard library and zoo's docs), a byte-level
#            BPE at GPT-2's and Llama 3's vocabulary sizes (session_inputs.py says why), two
#            token stores (zoo tokenize)
#   gpt2     zoo train gpt2-124m-tokens with eval and checkpoints on a short cadence, interrupted
#            by SIGINT (a user's Ctrl-C) once it logs step GPT2_KILL, resumed with --resume to
#            GPT2_STEPS; zoo eval and zoo sample from the run
#   twin     the same run uninterrupted; its losses and gradient norms against the resumed run's,
#            step by step, bitwise (session_report.py same-losses)
#   llama1b  a llama-1b checkpoint in Hugging Face's layout with random bf16 weights, zoo import,
#            zoo train llama-1b-tokens-lora from it (the base frozen, adapters training)
#   full1b   zoo train llama-1b-tokens: full AdamW, the update on the host (the recipe's placement)
#   llama3b  the same import and LoRA fine-tune at llama-3b's shapes, in microbatches of 2
#   dp       zoo train gpt2-124m-tokens-dp from the gpt2 run
#   frozen1b zoo train llama-1b-tokens from the llama-1b import with the token table and the first
#            3/4 of the layers frozen
#   auto     zoo train gpt2-124m-tokens at batch 16 with --remat auto: the policy and placement
#            searched under the chip's own memory (not in the default PARTS: its search compiles
#            every policy; on a CPU, under --memory-budget)
# The call must end within its 9 minutes: BUDGET seconds (default 450, what is left after tpu.sh's
# set-up) bound the script; a step gets what is left, and one that cannot start with at least
# its floor left is skipped (said so in the table). `SMALL=1` runs the same commands and flags on
# a CPU at tiny shapes (tests/e2e/test_user_session.py). Results come back from $OUT (at most
# eight files): session.md (the table), session.json, steps.tsv and logs.tar.gz (every step's
# log, and each run's metrics.jsonl, summary.json and recipe.json).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PY=${PY:-python3}
START=$(date +%s)
# A user's Ctrl-C: the default SIGINT handler even where a non-interactive shell's background job
# would inherit SIGINT ignored.
ZOO=("$PY" -c 'import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); from zoo.cli import main; sys.exit(main(sys.argv[1:]))')
INPUTS=("$PY" "$REPO/benchmarks/device/session_inputs.py")
REPORT=("$PY" "$REPO/benchmarks/device/session_report.py")

if [ "${SMALL:-}" = 1 ]; then
  # A shared 2-core CI machine runs each tiny step slower than the chip runs the real one.
  BUDGET=${BUDGET:-3000}; MAX_SCALE=${MAX_SCALE:-4}; SMALL_FLAG=--small; HF_1B=small; HF_3B=small; FREEZE_TO=1
  GPT2_STEPS=160; GPT2_EVERY=20; GPT2_KILL=50; NEW_TOKENS=32  # transformer-xs has 64 positions
  GPT2_SIZE=(--set model.preset=transformer-xs --set data.seq_len=32 --batch-size 4)
  HARNESS=(--small --batch 2 --zoo dense:dots --plain sdpa:dots,xla:dots --rounds 1 --steps 2)  # mfu.py's own tiny shape
  LLAMA_SIZE=(--set data.seq_len=32 --batch-size 4)
  FULL_SIZE=(--set model.preset=llama-xs --set data.seq_len=32 --batch-size 4 --microbatch-size 2)
  DP_SIZE=(--set model.preset=transformer-xs --set data.seq_len=32 --set dp.expected_batch_size=16 --set train.microbatch_size=4)
  AUTO_SIZE=("${GPT2_SIZE[@]}" --memory-budget 1073741824)  # a CPU has no memory limit to read
else
  BUDGET=${BUDGET:-450}; MAX_SCALE=${MAX_SCALE:-1}; SMALL_FLAG=; HF_1B=1b; HF_3B=3b; FREEZE_TO=12
  GPT2_STEPS=200; GPT2_EVERY=50; GPT2_KILL=120; NEW_TOKENS=128
  HARNESS=(--batch 16 --zoo splash:dots --plain splash:dots --rounds 3 --steps 5)  # gpt2-124m-tokens' shape and policy
  if [ "$("$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null)" != tpu ]; then
    # no splash off a TPU: the recipe's attention "auto" is dense there; the plain step's
    # cuDNN attention beside its einsum one
    HARNESS=(--batch 16 --zoo dense:dots --plain sdpa:dots,xla:dots --rounds 3 --steps 5)  # the recipe's own attention
  fi
  GPT2_SIZE=(); LLAMA_SIZE=(); FULL_SIZE=(); DP_SIZE=(); AUTO_SIZE=(--batch-size 16)
fi
PARTS=${PARTS:-gpt2 twin full1b llama1b llama3b dp frozen1b}
DEADLINE=$((START + BUDGET))

# The work folder: WORK, or the file system with the most room (a 1B run's checkpoint is about
# 20 GB; /tmp may be memory).
if [ -z "${WORK:-}" ]; then
  best=/tmp most=0
  for dir in "$HOME" /tmp /var/tmp; do
    room=$(df --output=avail "$dir" 2>/dev/null | tail -n 1)
    if [ -w "$dir" ] && [ "${room:-0}" -gt "$most" ] 2>/dev/null; then best=$dir most=$room; fi
  done
  WORK=$best/zoo-session
  rm -rf "$WORK"
fi
mkdir -p "$WORK/logs"
LOGS=$WORK/logs
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$WORK/jax-cache}  # a resumed run reads its step back
printf 'step\tstatus\texit\tseconds\tlimit\trun\n' > "$OUT/steps.tsv"
declare -A STATUS
FAILED=0

echo "session: $(date -u +%FT%TZ), budget ${BUDGET} s, work in $WORK, parts: inputs $PARTS"
{ df -h "$WORK" | tail -n 1; free -g | sed -n 2p; echo "cores: $(nproc)"; } 2>/dev/null | sed 's/^/session: /'

record() {  # record NAME STATUS EXIT SECONDS LIMIT RUN
  STATUS[$1]=$2
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$OUT/steps.tsv"
  case $2 in ok|skipped*) ;; *) FAILED=$((FAILED + 1)) ;; esac
}

ready() {  # ready NAME FLOOR NEEDS...: 0 if NAME may start: its needs ok and FLOOR seconds left
  local name=$1 floor=$2 need left
  shift 2
  [ "${SMALL:-}" = 1 ] && floor=1  # the floors are the chip's
  for need in "$@"; do
    if [ "${STATUS[$need]:-}" != ok ]; then
      echo "== $name: skipped (needs $need: ${STATUS[$need]:-not run})"
      record "$name" "skipped: needs $need" - 0 0 -
      return 1
    fi
  done
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt "$floor" ] || [ "$left" -lt 5 ]; then
    echo "== $name: skipped (${left} s left, it needs at least ${floor} s)"
    record "$name" "skipped: out of time" - 0 0 -
    return 1
  fi
}

limit_for() {  # limit_for MAX: MAX seconds (times MAX_SCALE), or what is left of the budget
  local left=$((DEADLINE - $(date +%s))) max=$(($1 * MAX_SCALE))
  echo $((left < max ? left : max))
}

shown() {  # a command as a user types it: zoo ..., python3 ...
  if [ "$1" = "$PY" ] && [ "${2:-}" = -c ]; then shift 3; echo "zoo $*"; else shift; echo "python3 $*"; fi
}

logged() {  # logged FILE STEP: 0 once metrics.jsonl FILE has a record of step STEP or later
  awk -v at="$2" 'match($0, /"step": [0-9]+/) { if (substr($0, RSTART + 8, RLENGTH - 8) + 0 >= at) found = 1 }
    END { exit !found }' "$1" 2>/dev/null
}

show() {  # the lines of a step's log worth reading in the call's output (the log keeps them all)
  grep -E 'step [0-9]+/[0-9]+|error|Error|warning|Traceback|interrupted|resuming|wrote |fine-tune:|session_|examples_per_sec|train_loss|eval_loss|mfu|MFU|tokens|remat |placement |offload |update_on|attention |epsilon|compile_count|resumed_from|params  |dtype |trainable [0-9]' "$1" \
    | grep -v '^│ blocks\.' | tail -n "${2:-24}" | sed 's/^/    /'
}

step() {  # step NAME FLOOR MAX RUN NEEDS -- CMD...: one bounded command, its log in $LOGS/NAME.log
  local name=$1 floor=$2 max=$3 run=$4 needs=()
  shift 4
  while [ "$1" != -- ]; do needs+=("$1"); shift; done
  shift
  ready "$name" "$floor" "${needs[@]}" || return 0
  local limit tic rc
  limit=$(limit_for "$max")
  echo "== $name (at most $limit s): $(shown "$@")"
  tic=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  local took=$(($(date +%s) - tic)) status=ok
  [ "$rc" = 0 ] || status=failed
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && status=timeout
  show "$LOGS/$name.log"
  echo "== $name: $status (exit $rc) after $took s"
  record "$name" "$status" "$rc" "$took" "$limit" "$run"
}

interrupted() {  # interrupted NAME FLOOR MAX RUN AT NEEDS -- CMD...: CMD, sent SIGINT once RUN logs step AT
  local name=$1 floor=$2 max=$3 run=$4 at=$5 needs=()
  shift 5
  while [ "$1" != -- ]; do needs+=("$1"); shift; done
  shift
  ready "$name" "$floor" "${needs[@]}" || return 0
  local limit tic rc pid sent=no
  limit=$(limit_for "$max")
  echo "== $name (at most $limit s; Ctrl-C once step $at is logged): $(shown "$@")"
  tic=$(date +%s)
  # No -k: GNU timeout arms its kill timer on any signal it hands on, and a run that stops
  # (its last metrics, its files closed) may take longer than that.
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if logged "$run/metrics.jsonl" "$at"; then
      kill -INT "$pid" && sent=yes  # timeout hands it to zoo: KeyboardInterrupt, exit 130
      break
    fi
    sleep 0.1
  done
  wait "$pid"
  rc=$?
  local took=$(($(date +%s) - tic)) status=ok
  if [ "$sent" != yes ] || [ "$rc" != 130 ] || ! grep -q 'interrupted after step' "$LOGS/$name.log"; then
    status="failed: not interrupted as planned (SIGINT sent: $sent)"
  fi
  show "$LOGS/$name.log"
  echo "== $name: $status (exit $rc) after $took s"
  record "$name" "$status" "$rc" "$took" "$limit" "$run"
}

has() { [[ " $PARTS " == *" $1 "* ]]; }

# --- inputs: a corpus, two vocabularies, two token stores ------------------------------------
VOCAB=$WORK/vocab
step corpus 5 60 - -- "${INPUTS[@]}" corpus "$WORK/corpus" $SMALL_FLAG
step vocab 20 150 - corpus -- "${INPUTS[@]}" vocab "$WORK/corpus" "$VOCAB" $SMALL_FLAG ${GPT2_TOKENIZER:+--gpt2 "$GPT2_TOKENIZER"}
if has gpt2 || has twin || has dp || has auto; then
  step tokenize_gpt2 10 150 - vocab -- "${ZOO[@]}" tokenize "text:$WORK/corpus" --out "$WORK/gpt2.tokens" \
    --vocabulary "hf:$VOCAB/gpt2/tokenizer.json" --no-progress
fi
if has llama1b || has full1b || has llama3b || has frozen1b; then
  step tokenize_llama 10 150 - vocab -- "${ZOO[@]}" tokenize "text:$WORK/corpus" --out "$WORK/llama.tokens" \
    --vocabulary "hf:$VOCAB/llama/tokenizer.json" --no-progress
fi
GPT2_DATA=(--dataset "tokens:$WORK/gpt2.tokens")
LLAMA_DATA=(--dataset "tokens:$WORK/llama.tokens")
GPT2=(train gpt2-124m-tokens "${GPT2_DATA[@]}" --steps "$GPT2_STEPS" --set "train.eval_every=$GPT2_EVERY"
  --set "train.checkpoint_every=$GPT2_EVERY" "${GPT2_SIZE[@]}")

for part in $PARTS; do
  case $part in
  gpt2)
    RUN=$WORK/runs/gpt2
    interrupted gpt2_train 60 200 "$RUN" "$GPT2_KILL" tokenize_gpt2 -- "${ZOO[@]}" "${GPT2[@]}" --out "$RUN"
    step gpt2_resume 40 200 "$RUN" gpt2_train -- "${ZOO[@]}" "${GPT2[@]}" --resume --out "$RUN"
    step gpt2_eval 15 90 - gpt2_resume -- "${ZOO[@]}" eval "$RUN"
    step gpt2_sample 15 90 - gpt2_resume -- "${ZOO[@]}" sample "$RUN" --prompt "def main(argv):" \
      --max-new-tokens "$NEW_TOKENS" --temperature 0.8 --seed 0
    ;;
  twin)
    TWIN=$WORK/runs/gpt2-twin
    step gpt2_twin 60 200 "$TWIN" tokenize_gpt2 -- "${ZOO[@]}" "${GPT2[@]}" --out "$TWIN"
    step same_losses 1 30 - gpt2_resume gpt2_twin -- "${REPORT[@]}" same-losses "$WORK/runs/gpt2" "$TWIN"
    # the harness's step at the twin's shape and policy (zoo's compiled step and a plain-JAX one,
    # no loader, bar, eval or checkpoint): the table sets the CLI's tokens/s against it
    step harness_gpt2 40 150 - gpt2_twin -- "$PY" "$REPO/benchmarks/device/mfu.py" "${HARNESS[@]}" \
      --json "$LOGS/harness_gpt2.json"
    ;;
  llama1b)
    step hf_llama1b 10 90 - vocab -- "${INPUTS[@]}" hf-llama "$HF_1B" "$WORK/hf/llama-1b" \
      --tokenizer "$VOCAB/llama/tokenizer.json"
    step import_llama1b 15 150 - hf_llama1b -- "${ZOO[@]}" import "$WORK/hf/llama-1b" --out "$WORK/imports/llama-1b" \
      --dtype bfloat16
    step lora_llama1b 40 200 "$WORK/runs/llama-1b-lora" import_llama1b tokenize_llama -- "${ZOO[@]}" \
      train llama-1b-tokens-lora --init-from "$WORK/imports/llama-1b" "${LLAMA_DATA[@]}" --steps 3 \
      --set train.eval_batches=2 "${LLAMA_SIZE[@]}" --out "$WORK/runs/llama-1b-lora"
    ;;
  full1b)
    step full_llama1b 90 300 "$WORK/runs/llama-1b-full" tokenize_llama -- "${ZOO[@]}" train llama-1b-tokens \
      "${LLAMA_DATA[@]}" --steps 2 --set train.eval_batches=1 "${FULL_SIZE[@]}" --out "$WORK/runs/llama-1b-full"
    rm -rf "$WORK/runs/llama-1b-full/checkpoints"  # about 20 GB: the room the next parts need
    ;;
  llama3b)
    step hf_llama3b 15 120 - vocab -- "${INPUTS[@]}" hf-llama "$HF_3B" "$WORK/hf/llama-3b" \
      --tokenizer "$VOCAB/llama/tokenizer.json"
    step import_llama3b 20 180 - hf_llama3b -- "${ZOO[@]}" import "$WORK/hf/llama-3b" --out "$WORK/imports/llama-3b" \
      --dtype bfloat16
    rm -rf "$WORK/hf/llama-3b"
    step lora_llama3b 50 240 "$WORK/runs/llama-3b-lora" import_llama3b tokenize_llama -- "${ZOO[@]}" \
      train llama-1b-tokens-lora --init-from "$WORK/imports/llama-3b" "${LLAMA_DATA[@]}" --steps 3 \
      --microbatch-size 2 --set train.eval_batches=1 "${LLAMA_SIZE[@]}" --out "$WORK/runs/llama-3b-lora"
    rm -rf "$WORK/imports/llama-3b"
    ;;
  dp)
    step dp_gpt2 60 200 "$WORK/runs/gpt2-dp" gpt2_resume -- "${ZOO[@]}" train gpt2-124m-tokens-dp \
      --init-from "$WORK/runs/gpt2" "${GPT2_DATA[@]}" --steps 2 --set train.eval_batches=1 "${DP_SIZE[@]}" \
      --out "$WORK/runs/gpt2-dp"
    ;;
  frozen1b)
    step frozen_llama1b 60 200 "$WORK/runs/llama-1b-frozen" import_llama1b tokenize_llama -- "${ZOO[@]}" \
      train llama-1b-tokens --init-from "$WORK/imports/llama-1b" "${LLAMA_DATA[@]}" --freeze 'embed.*' \
      --freeze "blocks[0:$FREEZE_TO].*" --steps 2 --set train.eval_batches=1 "${FULL_SIZE[@]}" \
      --out "$WORK/runs/llama-1b-frozen"
    rm -rf "$WORK/runs/llama-1b-frozen/checkpoints"
    ;;
  auto)
    step auto_gpt2 60 300 "$WORK/runs/gpt2-auto" tokenize_gpt2 -- "${ZOO[@]}" train gpt2-124m-tokens "${GPT2_DATA[@]}" \
      --remat auto --steps 30 --set train.eval_batches=1 "${AUTO_SIZE[@]}" --out "$WORK/runs/gpt2-auto"
    ;;
  *) echo "session: unknown part $part (parts: gpt2 twin llama1b full1b llama3b dp frozen1b auto)"; FAILED=$((FAILED + 1)) ;;
  esac
done

"${REPORT[@]}" table "$OUT/steps.tsv" --logs "$LOGS" --out "$OUT" --budget "$BUDGET" --started "$START"
(cd "$WORK" && find runs -maxdepth 2 \( -name metrics.jsonl -o -name summary.json -o -name recipe.json \) -print0 2>/dev/null \
  | tar -czf "$OUT/logs.tar.gz" logs --null -T -) || echo "session: the logs were not all packed"
echo "session: $FAILED step(s) failed; $(($(date +%s) - START)) s in all"
[ "$FAILED" = 0 ]
