# Two entry points: `make run` (the main job on offline data) and `make test`; `make help` lists
# every target. Each creates .venv from pyproject.toml's ranges at CI's exact versions
# (constraints.txt) when it is missing or stale. A target's `## ` comment is its line in `make help`.
PYTHON ?= $(shell command -v python3.12 2>/dev/null || echo python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Tests marked `numerics` compare floats from two programs (tests/numerics.py): DP clipping,
# ghost clipping, model parity, remat policies, freezing. XLA's CPU vector width changes the order
# of float32 sums, so `make test` runs one cell per mechanism of them (ISA_SELECT) under two
# instruction-set caps, AVX2 and SSE4_2, compiled as users compile (no FAST_XLA), and its main
# pass leaves exactly that set out (ISA_REST): every test runs once at least, the set under both
# caps, and none three times. (Under AVX2 the set runs at the machine's own width where the
# machine has no AVX-512. The caps are x86 names: elsewhere the set runs once, uncapped.)
# The set takes one cell per mechanism; the cells left out of it run once, in the main pass at
# FAST_XLA. Left out of the set:
# - Equinox cases: they compute what their NNX twins compute, and the parity tests, which are
#   re-run, hold the two backends to the float rule;
# - the negative tests ("the float rule still catches ..."): a planted bug misses the rule by
#   orders of magnitude more than an instruction set moves a sum;
# - remat policies that only choose which names to save or where (none, dots, save-attn,
#   minimal, full-lean, the offloads, custom): full, nested and recursive, which change how
#   the stack runs, are re-run on every kind;
# - ghost-clipping cells beyond ghost against vmap (first backward method), frozen layers and
#   the conv rule's three cells; a form per site beyond the transformer's cells (records and
#   users) and the tied head under remat and bf16 (the forms are the ghost cells' own ops);
#   parity variants of a kind (digits, head counts, kv heads), and of decoding's cached
#   logits (kv heads, chunked, tied, LoRA: the transformer, llama-kv2 and llama3-rope cells
#   run); the chunked-attention and chunked-MLP model cells (the ops' own cells are re-run); freezing per kind (test_freeze's cells are re-run);
#   LoRA beyond the transformer's two-backend cell (an adapter is two more dense ops: ghost,
#   remat and merge cells add no mechanism the re-run lacks);
# - the norm taps' per-layer sweeps under none and dots (their full and nested cells, the
#   materialised form, auto and bf16 are re-run) and the taps' planted bugs ("... is caught").
# - splash's and cuDNN's attention cells beyond grouped kv heads (cuDNN's batched and per example).
# - the clipping styles' MLP, CNN and untied transformer cells: each style by each method runs on
#   the tied head (a style's groups are the same code on every kind; the conv rule's cells above
#   are re-run).
# - the host update's float32 cell and its bf16 cell with microbatches (the bf16 cell under DP runs
#   the same update, an elementwise one; microbatches add up in their own cells); DP microbatches
#   in bf16 (the precision cells re-run bf16) and the MLP's ghost-records and vmap-users cells
#   (ghost-users, vmap-records and the transformer under full remat run);
#   the norm taps' in-scan cells of llama and of nested remat on the untied transformer (full on
#   the transformer and tied head, nested on the tied head run; llama's norms run in the ghost
#   cells against vmap); the MLP's variants in the converted-weights cells.
# - host_update.py's bench against the device step (benchmarks/device: the script's run of the
#   host update, whose cells in tests/parallel/test_host_step.py are re-run), and mfu.py's plain
#   step in its two attentions (jax.nn.dot_product_attention against the einsum form: a head or
#   mask mix-up misses by far more than a sum's order; cuDNN's grouped cells re-run the op).
ISA_SKIP := eqx or still_catches or (test_splash.py and not grouped) or (test_cudnn.py and not grouped) or chunked_attention_gives or chunked_mlp_gives or through_chunked
ISA_SKIP += or ((test_setup.py or test_lora) and not (same_logits_and_grads_in_both_backends and transformer))
ISA_SKIP += or (policy_matches_no_remat and (none or dots or save-attn or full-lean or minimal or offload))
ISA_SKIP += or ((test_api.py or test_conv.py or test_rules.py or test_ghost) and not ((matches_vmap_path and not second_backward) or frozen_layers or conv_norms))
ISA_SKIP += or (test_registry.py and freezing_by_path)
ISA_SKIP += or (test_forms.py and not (transformer or bf16))
ISA_SKIP += or (converted_weights and (digits or heads or kv or mlp-))
ISA_SKIP += or (cached_logits_equal and (chunked or tied or kv1 or lora))
ISA_SKIP += or (transformers_logits and not (gpt2 or llama3)) or (tied_head_matches and not gpt2) or apply_fn_read
ISA_SKIP += or (stays_on_the_host and (True or optimizer-False))
ISA_SKIP += or (test_taps.py and (is_caught or are_caught or ((none- or dots-) and (norms_are_taken or kept_pieces))))
ISA_SKIP += or (test_clip_styles.py and (mlp- or cnn- or transformer-)) or host_update_bench_runs_what
ISA_SKIP += or (host_update_equals and (float32 or bfloat16-2)) or (microbatches_add_up and (bf16 or ghost-records or vmap-users))
ISA_SKIP += or (norms_are_taken_in_the_scan and (full-llama or nested-transformer or nested-llama))
ISA_SKIP += or plain_steps_attentions
ISA_SELECT := -m numerics -k "not ($(ISA_SKIP))"
# Its complement, for the main pass: -k matches marker names too (and test, file and folder
# names, which tests/test_makefile.py keeps free of the word "numerics" outside the marked files).
ISA_REST := -k "not numerics or ($(ISA_SKIP))"
ISAS := $(if $(filter x86_64 amd64 AMD64 i686,$(shell uname -m)),AVX2 SSE4_2,native)

# `make test-oldest`: the oldest versions zoo supports (constraints-oldest.txt: JAX 0.10.2 and
# flax 0.12.8 on Python 3.11, the TPU v5e image's) in a second venv. Every test there also runs in
# `make test`; the pass re-runs only what can change with the JAX, flax, Equinox or optax
# version: the models, attention and splash, remat policies and jaxprs, host offload and
# sharding rules, precision, the float rule, and DP's numerics (clipping, ghost clipping and its
# jaxpr rules, microbatches, noise and its PRNGs, users, DP-PCA, the pitfalls, the noise
# transform). Left out: DP's pure-Python parts (accounting and dp_accounting, which is pinned at
# one version in both sets; sampling, plans, ELS, validation, the mechanism tables), the
# end-to-end runs, and `slow` tests.
OLDEST_PYTHON ?= $(shell command -v python3.11 2>/dev/null || echo python3)
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed
OLDEST_DP := clipping microbatch noise philox users pca_fit pitfalls
OLDEST_TESTS := tests/models tests/test_remat.py tests/test_precision.py tests/test_numerics.py tests/parallel
OLDEST_TESTS += tests/dp/ghost tests/dp/mechanisms/test_base.py $(OLDEST_DP:%=tests/dp/test_%.py)
# Left out there, to keep the pass under 8 minutes on 2 cores (as the ISA re-run, a cell that
# repeats a mechanism already run): the negative tests (a planted bug misses the float rule by
# orders of magnitude at any version), the CNN's CLI run and the chunked MLP's memory count,
# remat policies that only choose which names to save or where (dots, full-lean, minimal and
# offload-minimal, save-attn, custom: none, full, offload-layer-input and nested run on NNX, full
# on Equinox), bf16 against float32 on Equinox (the NNX cells and the two backends' parity cells
# run), parity variants of a kind, and ghost-clipping cells beyond ghost against vmap, frozen
# layers and the conv norms (a form per site: the transformer's cells, the tied head under remat
# and bf16); the norm taps' planted bugs and their
# per-layer sweeps under dots, and of the in-scan sweep the cells the numerics set also leaves out
# plus none on llama and the tied head (none on the transformer, full on the transformer and
# tied head, nested on the tied head run); cuDNN attention's cells beyond grouped kv heads; the
# host update's float32 cell and the DP microbatch cells the numerics set leaves out; the
# pitfalls' accountant check and the mechanisms' plans under each performance setting (pure
# Python: dp_accounting is pinned at one version in both sets; DP-PCA's fit runs in test_pca_fit).
OLDEST_SKIP := still_catches or through_the_cli or needs_less_temp_memory or (test_cudnn.py and not grouped)
OLDEST_SKIP += or (policy_matches_no_remat and (dots or full-lean or minimal or save-attn or custom or nested-eqx))
OLDEST_SKIP += or (bf16_loss_and_gradients_match_float32 and eqx)
OLDEST_SKIP += or (converted_weights and (digits or heads or kv))
OLDEST_SKIP += or ((test_api.py or test_conv.py or test_rules.py) and not ((matches_vmap_path and not second_backward) or frozen_layers or conv_norms))
OLDEST_SKIP += or (test_forms.py and not (transformer or bf16 or measure))
OLDEST_SKIP += or (test_taps.py and (is_caught or are_caught or (dots- and (norms_are_taken or kept_pieces))))
OLDEST_SKIP += or (host_update_equals and float32) or (microbatches_add_up and (bf16 or ghost-records or vmap-users))
OLDEST_SKIP += or (norms_are_taken_in_the_scan and (none-llama or none-tied or full-llama or nested-transformer or nested-llama))
OLDEST_SKIP += or accountant_is_monotone or no_performance_setting_changes or performance_settings_reach

.PHONY: help run test test-isa test-oldest lint bench docs clean
.DEFAULT_GOAL := help

help: ## this list
	@awk -F ':.*## ' '/^[a-z-]+:.*## / { printf "  make %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 12), "CI lock constraints.txt (JAX 0.12) needs Python >= 3.12; found " + sys.version'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

$(OLDEST_STAMP): pyproject.toml constraints-oldest.txt
	$(OLDEST_PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "make test-oldest needs Python 3.11 (OLDEST_PYTHON=...); found " + sys.version'
	test -x $(OLDEST)/bin/python || $(OLDEST_PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install -q -c constraints-oldest.txt -e ".[dev]"
	touch $(OLDEST_STAMP)

run: $(STAMP) ## create .venv, then train digits-transformer with --remat full on offline digits
	$(BIN)/zoo train digits-transformer --remat full
	@echo "zoo is $(BIN)/zoo: \`source $(BIN)/activate\` puts it on this shell's PATH (README, Command line)"

# tests/e2e/parallel needs 8 devices, and XLA takes the simulated device count only at start-up:
# that folder runs as a session of its own.
MESH_XLA := --xla_force_host_platform_device_count=8

# `make test`'s main pass and `make test-oldest` compile every program at XLA's CPU optimisation
# level 0 (tests/conftest.py's FAST_COMPILE, for the CLI runs and their child processes too): the
# suite's tiny programs compile in about 0.7x the time, and a run's results move far inside the
# float rule, which every comparison between two programs uses. The numerics set (`make
# test-isa`, a part of `make test`) compiles as users do, since its point is how the CPU's vector
# width orders float sums.
FAST_XLA := --xla_backend_optimization_level=0

# The suite's processes write bytecode (into __pycache__ folders, which git ignores), whatever
# the shell says: under PYTHONDONTWRITEBYTECODE=1 (CI's image sets it) each of the run's
# processes (5 pytest sessions of 3 processes each, and every CLI run or bench a test starts)
# compiled zoo's and the tests' sources again, and pytest rewrote every test module's asserts
# again: collecting the suite took 7.8 s of CPU a process on the 2-core machine, 5.0 s with them
# kept.
PYC := PYTHONDONTWRITEBYTECODE=

test: $(STAMP) ## the whole suite: pytest -n 2, the numerics set under AVX2 and SSE4_2, the mesh tests
	$(PYC) XLA_FLAGS="$${XLA_FLAGS:-} $(FAST_XLA)" $(BIN)/python -m pytest -q -n 2 --dist loadgroup --ignore=tests/e2e/parallel $(ISA_REST)
	$(MAKE) --no-print-directory test-isa
	$(PYC) XLA_FLAGS="$${XLA_FLAGS:-} $(FAST_XLA) $(MESH_XLA)" $(BIN)/python -m pytest -q -n 2 --dist loadgroup tests/e2e/parallel

test-isa: $(STAMP) ## the numerics set alone under each CPU instruction-set cap (a part of make test)
	@echo "== instruction-set caps for the numerics set: $(ISAS)"
	set -e; for isa in $(ISAS); do \
	  cap=$$([ $$isa = native ] || echo --xla_cpu_max_isa=$$isa); \
	  echo "== the numerics set under $${cap:-the machine's own instruction set}"; \
	  $(PYC) XLA_FLAGS="$$(echo $${XLA_FLAGS:-} $$cap)" $(BIN)/python -m pytest -q -n 2 --dist loadgroup --ignore=tests/e2e/parallel $(ISA_SELECT); \
	done

test-oldest: $(OLDEST_STAMP) ## unit tests at the oldest supported versions, in .venv-oldest
	@$(OLDEST)/bin/python -c 'import sys, jax, flax; print(f"== oldest supported: Python {sys.version.split()[0]}, JAX {jax.__version__}, flax {flax.__version__}")'
	$(PYC) XLA_FLAGS="$${XLA_FLAGS:-} $(FAST_XLA)" $(OLDEST)/bin/python -m pytest -q -n 2 --dist loadgroup -m "not slow" -k "not ($(OLDEST_SKIP))" --durations=15 $(OLDEST_TESTS)

lint: $(STAMP) ## ruff check and ruff format --check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# What the docs show, run as written (the README's block, each doc's first example and every
# doc's Python block), and the docs' links and scripts.
DOCS_TESTS := tests/e2e/test_docs.py tests/e2e/test_doc_python.py tests/test_doc_links.py

docs: $(STAMP) ## run the docs' commands and Python blocks as written, and check their links
	$(PYC) $(BIN)/python -m pytest -q -n 2 --dist loadgroup $(DOCS_TESTS)

# One quick CPU run of each `zoo bench` (one timing round, small shapes): a smoke run that every
# bench still runs and prints its table; the figures of benchmarks/*/RESULTS.md come from the
# full commands beside them (benchmarks/README.md).
bench: $(STAMP) ## one quick CPU run of each zoo bench (minutes); full runs: benchmarks/README.md
	$(BIN)/zoo bench engine --steps 2 --repeats 1
	$(BIN)/zoo bench remat transformer-s --policies none,full --layers 2 --repeats 1
	$(BIN)/zoo bench finetune transformer-s --layers 2 --repeats 1 --steps 1
	$(BIN)/zoo bench dp mlp-s --batch 32 --no-sweep --rounds 1 --steps 1
	XLA_FLAGS="$${XLA_FLAGS:-} $(MESH_XLA)" $(BIN)/zoo bench scale mlp-s --mesh 'data=1;data=8' --repeats 1 --steps 1

clean: ## remove .venv, .venv-oldest, runs/ and pytest's cache
	rm -rf $(VENV) $(OLDEST) runs .pytest_cache
