"""What a user's session on the chip starts from, made offline: a text corpus, two vocabularies
of the sizes the recipes are shaped for, and Llama checkpoints in Hugging Face's layout with
random weights. ``session.sh`` calls it; each part is one subcommand.

    python benchmarks/device/session_inputs.py corpus DIR [--small]
    python benchmarks/device/session_inputs.py vocab CORPUS_DIR OUT_DIR [--small] [--gpt2 FILE]
    python benchmarks/device/session_inputs.py hf-llama 1b|3b|small OUT_DIR --tokenizer FILE

``corpus``: this Python's standard library (its ``.py`` files that read as UTF-8) and zoo's
``docs/`` tree, copied into DIR, so that ``zoo tokenize text:DIR`` reads real text that every
machine has, with no network. ``--small``: a few hundred kB of it.

``vocab``: no GPT-2 or Llama ``tokenizer.json`` ships with zoo or its test fixtures (the fixtures'
have 64 tokens), and the chip has no network. A byte-level BPE is trained on the corpus once
(Hugging Face ``tokenizers``, GPT-2's pre-tokenizer) and written at the two sizes the recipes'
shapes need: ``gpt2/tokenizer.json`` with GPT-2's 50,257 ids (50,256 byte-level tokens and
``<|endoftext|>``) and ``llama/tokenizer.json`` with Llama 3's 128,256 (BPE up to 128,000 and
its 256 special tokens at 128,000..128,255; unused special tokens fill the gap where the
corpus gives fewer merges). A
BPE's merges are ordered, and its first N merges are the BPE trained to N, so the smaller
vocabulary is the larger one cut. The model's shapes, FLOPs and memory are those of GPT-2's and
Llama 3's vocabularies; the ids are not theirs (nothing here compares text with those models).
``--gpt2 FILE`` takes a real GPT-2 ``tokenizer.json`` instead, where one is at hand.
``--small``: 512 and 768 ids, for the tiny presets.

``hf-llama``: ``config.json`` as Llama 3.2 1B's or 3B's (or a tiny one), its tensors under
Hugging Face's names, in bf16, in shards of about 2 GB with ``model.safetensors.index.json``
(what ``save_pretrained`` writes for a large model), and the given ``tokenizer.json``. The
weights are normal draws (scale 0.02; norm scales 1), made on JAX's default device one tensor
at a time (the chip draws 3B of them in seconds; a host CPU takes minutes).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL_FILES = ("json", "email", "html")  # stdlib packages whose .py files make the small corpus
SIZES = {"gpt2": (50_257, 1), "llama": (128_256, 256)}  # ids, special tokens at the end
SMALL_SIZES = {"gpt2": (512, 1), "llama": (768, 256)}
SHARD_BYTES = 2 * 10**9

LLAMA_3_2 = {  # the fields of meta-llama/Llama-3.2-1B's config.json that the two sizes share
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}
LLAMA = {
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 64},
    "3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
           "num_key_value_heads": 8, "head_dim": 128},
    "small": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16},
}  # fmt: skip


def say(text: str) -> None:
    print(f"session_inputs: {text}", flush=True)


# --- the corpus -----------------------------------------------------------------------------


def corpus_files(small: bool) -> list[Path]:
    """The standard library's ``.py`` files (in the small form, those of :data:`SMALL_FILES`'
    packages) and zoo's ``docs/*.md``, in name order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if small:
        found = [p for name in SMALL_FILES for p in sorted((stdlib / name).glob("*.py"))]
    else:
        found = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    return found + sorted((REPO / "docs").rglob("*.md"))


def write_corpus(out: Path, small: bool) -> dict:
    """Copy :func:`corpus_files` that read as UTF-8 into ``out`` (flat, numbered names)."""
    out.mkdir(parents=True, exist_ok=True)
    count = size = 0
    for path in corpus_files(small):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # a file that is not UTF-8 text would be refused by zoo tokenize
        if not text.strip():
            continue
        (out / f"{count:05d}-{path.name}.txt").write_text(text, encoding="utf-8")
        count, size = count + 1, size + len(text.encode())
    return {"files": count, "bytes": size}


# --- the vocabularies -----------------------------------------------------------------------


def train_bpe(corpus: Path, size: int) -> dict:
    """A byte-level BPE of at most ``size`` ids trained on the files of ``corpus``, as the
    ``tokenizer.json`` document."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train([str(p) for p in sorted(corpus.iterdir())], trainer)
    return json.loads(tok.to_str())


def cut(doc: dict, ids: int, specials: list[str]) -> dict:
    """``doc`` with its first ``ids - len(specials)`` ids (the byte alphabet and the first
    merges) and ``specials`` after them: exactly ``ids`` ids, the last ones special."""
    model = doc["model"]
    vocab, merges = model["vocab"], model["merges"]
    alphabet = len(vocab) - len(merges)
    for i, merge in enumerate(merges):  # merge i made id alphabet + i: a prefix of merges is a BPE
        a, b = merge if isinstance(merge, list) else merge.split(" ")
        if vocab[a + b] != alphabet + i:
            raise SystemExit(f"session_inputs: merge {i} ({a!r}, {b!r}) is not id {alphabet + i}")
    keep = min(len(vocab), ids - len(specials))
    unused = [f"<|unused_{i}|>" for i in range(ids - keep - len(specials))]  # a corpus short of merges
    out = json.loads(json.dumps(doc))
    out["model"]["vocab"] = {token: i for token, i in vocab.items() if i < keep}
    out["model"]["merges"] = merges[: keep - alphabet]
    out["added_tokens"] = [
        {"id": keep + j, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for j, token in enumerate(unused + specials)
    ]  # fmt: skip
    return out


def llama_specials(count: int) -> list[str]:
    """Llama 3's layout: ``<|begin_of_text|>`` and ``<|end_of_text|>`` first, then reserved ones."""
    return ["<|begin_of_text|>", "<|end_of_text|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(count - 2)
    ]


def write_vocabularies(corpus: Path, out: Path, small: bool, gpt2: Path | None) -> dict:
    sizes = SMALL_SIZES if small else SIZES
    tic = time.perf_counter()
    doc = train_bpe(corpus, sizes["llama"][0] - sizes["llama"][1])
    trained = len(doc["model"]["vocab"])
    made = {
        "gpt2": cut(doc, sizes["gpt2"][0], ["<|endoftext|>"]),
        "llama": cut(doc, sizes["llama"][0], llama_specials(sizes["llama"][1])),
    }
    report = {"trained_ids": trained, "train_s": round(time.perf_counter() - tic, 1)}
    for name, document in made.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "tokenizer.json").write_text(json.dumps(document, ensure_ascii=False))
        report[name] = len(document["model"]["vocab"]) + len(document["added_tokens"])
    if gpt2 is not None:
        shutil.copyfile(gpt2, out / "gpt2" / "tokenizer.json")
        report["gpt2"] = f"copied from {gpt2}"
    return report


# --- a Llama checkpoint in Hugging Face's layout ---------------------------------------------


def llama_config(size: str, vocab: int | None) -> dict:
    config = {**LLAMA_3_2, **LLAMA[size]}
    if size == "small":
        config["vocab_size"] = vocab
    return config


def llama_tensors(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every tensor ``save_pretrained`` writes for ``config`` (a tied head
    writes no ``lm_head.weight``)."""
    d, f, heads = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    kv, head = config["num_key_value_heads"], config["head_dim"]
    out = [("model.embed_tokens.weight", (config["vocab_size"], d))]
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        out += [
            (layer + "input_layernorm.weight", (d,)),
            (layer + "self_attn.q_proj.weight", (heads * head, d)),
            (layer + "self_attn.k_proj.weight", (kv * head, d)),
            (layer + "self_attn.v_proj.weight", (kv * head, d)),
            (layer + "self_attn.o_proj.weight", (d, heads * head)),
            (layer + "post_attention_layernorm.weight", (d,)),
            (layer + "mlp.gate_proj.weight", (f, d)),
            (layer + "mlp.up_proj.weight", (f, d)),
            (layer + "mlp.down_proj.weight", (d, f)),
        ]
    out.append(("model.norm.weight", (d,)))
    if not config["tie_word_embeddings"]:
        out.append(("lm_head.weight", (config["vocab_size"], d)))
    return out


def write_hf_llama(size: str, out: Path, tokenizer: Path) -> dict:
    import jax
    import jax.numpy as jnp
    from safetensors.flax import save_file

    vocab = json.loads(tokenizer.read_text())
    ids = len(vocab["model"]["vocab"]) + len(vocab.get("added_tokens", []))
    config = llama_config(size, ids)
    out.mkdir(parents=True, exist_ok=True)
    draw = jax.jit(lambda key, shape: 0.02 * jax.random.normal(key, shape, jnp.bfloat16), static_argnums=1)
    tensors = llama_tensors(config)
    shards, shard, held, total = [], {}, 0, 0
    for index, (name, shape) in enumerate(tensors):
        value = (
            jnp.ones(shape, jnp.bfloat16)
            if name.endswith("norm.weight")
            else draw(jax.random.key(index), shape)
        )
        shard[name] = value
        held += value.size * 2
        if held >= SHARD_BYTES or index == len(tensors) - 1:
            shards.append(list(shard))  # the names; the arrays go once written
            total += held
            path = out / f"shard-{len(shards)}.safetensors"
            save_file(shard, str(path), metadata={"format": "pt"})
            shard, held = {}, 0
    names = {}
    for n in range(1, len(shards) + 1):  # Hugging Face's names, once the count is known
        final = "model.safetensors" if len(shards) == 1 else f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        (out / f"shard-{n}.safetensors").rename(out / final)
        names.update(dict.fromkeys(shards[n - 1], final))
    if len(shards) > 1:  # one file needs no index
        index_doc = {"metadata": {"total_size": total}, "weight_map": names}
        (out / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "do_sample": True,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    shutil.copyfile(tokenizer, out / "tokenizer.json")  # the same bytes: the store's vocabulary
    params = sum(int(jnp.prod(jnp.array(s))) for _, s in tensors)
    return {"params": params, "bytes": total, "shards": len(shards), "vocab": config["vocab_size"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("out", type=Path)
    c.add_argument("--small", action="store_true")
    v = sub.add_parser("vocab")
    v.add_argument("corpus", type=Path)
    v.add_argument("out", type=Path)
    v.add_argument("--small", action="store_true")
    v.add_argument("--gpt2", type=Path, help="a real GPT-2 tokenizer.json, used as it is")
    h = sub.add_parser("hf-llama")
    h.add_argument("size", choices=sorted(LLAMA))
    h.add_argument("out", type=Path)
    h.add_argument("--tokenizer", type=Path, required=True)
    args = p.parse_args(argv)
    tic = time.perf_counter()
    if args.what == "corpus":
        report = write_corpus(args.out, args.small)
    elif args.what == "vocab":
        report = write_vocabularies(args.corpus, args.out, args.small, args.gpt2)
    else:
        report = write_hf_llama(args.size, args.out, args.tokenizer)
    say(f"{args.what}: {json.dumps(report)} in {time.perf_counter() - tic:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
