"""What a DP run may take from its data: nothing that sets the model's domain.

A vocabulary fitted on the training text, or a class set read off the training labels, is a
function of the private data: one record with a new character or a new label changes the
model's shape, and the shape is released with every checkpoint (domain inference). Under DP
the vocabulary and the classes must be declared public instead:

- a vocabulary fixed in advance: ``data.vocabulary = "bytes"`` (UTF-8 bytes,
  :meth:`CharTokenizer.utf8_bytes`) or another declared form (``zoo.data.vocabulary``), the
  vocabulary a token store was written with (``zoo tokenize`` takes only declared ones), or the
  tokenizer of the public checkpoint a run starts from (``model.init_from``, which must itself
  be public or trained on other data: docs/dp.md);
- a class set listed in the recipe: ``data.classes``.
"""

from __future__ import annotations

from zoo.configs import DataConfig
from zoo.data.dataset import Classify, LanguageModel, task_type
from zoo.data.errors import DatasetError
from zoo.data.tokenizer import CharTokenizer
from zoo.data.tokens.store import stored_vocabulary
from zoo.data.vocabulary import FORMS, check_form, resolve, same_ids
from zoo.errors import ZooError

VOCABULARIES = FORMS  # data.vocabulary; unset: every character of the text (not public)


def declared_tokenizer(vocabulary: str | None, given: CharTokenizer | None) -> CharTokenizer | None:
    """The tokenizer a recipe declares: ``given`` (a checkpoint's), the fixed vocabulary
    ``vocabulary`` names (:mod:`zoo.data.vocabulary`), or None (fit one on the text)."""
    if vocabulary is None:
        return given
    if vocabulary.startswith("hf:"):  # a Hugging Face tokenizer.json (zoo.data.hf_tokenizer)
        from zoo.data.hf_tokenizer import HFTokenizer

        return HFTokenizer.from_source(vocabulary[3:])
    declared = resolve(vocabulary)
    if given is not None and not same_ids(given, declared):
        if isinstance(given, CharTokenizer):
            own = "a character vocabulary"
        else:
            own = "a tokenizer (tokenizer.json)" if hasattr(given, "spec") else "a vocabulary of ids"
        raise DatasetError(
            f"data.vocabulary={vocabulary!r} but the checkpoint in model.init_from has {own} "
            "of its own; drop data.vocabulary to keep the checkpoint's"
        )
    return declared


def check_public_domain(
    data: DataConfig, task: str, *, checkpoint: str | None = None, store_vocabulary: str | None = None
) -> None:
    """Refuse (``ZooError``) a DP run whose vocabulary or class set would come from its data.

    ``task`` is ``"lm"`` or ``"classify"``; ``checkpoint`` is the (public) checkpoint the run
    starts from (``model.init_from``), whose tokenizer it takes; ``store_vocabulary`` is the
    declared vocabulary (a form of :data:`VOCABULARIES`) a token store was written with
    (``zoo tokenize --vocabulary``, which fits none on the text).
    """
    if store_vocabulary is None:  # a token store declares its own (read off store.json)
        store_vocabulary = stored_vocabulary(data.dataset)
    if store_vocabulary is not None:
        check_form(store_vocabulary)  # a store names one of the declared forms, or is refused
    declared = data.vocabulary is not None or store_vocabulary is not None
    _PUBLIC_DOMAIN[task_type(task).name](data, declared=declared, checkpoint=checkpoint)


def _vocabulary_public(data: DataConfig, *, declared: bool, checkpoint: str | None) -> None:
    """An LM's domain is its vocabulary: declared, a store's, or the start checkpoint's."""
    if not declared and not checkpoint:
        raise ZooError(
            f"DP run on {data.dataset!r}: the vocabulary would be every character of the private "
            "training text, so one record with a new character changes the model; set "
            'data.vocabulary = "bytes" (a fixed byte-level vocabulary) or another declared one '
            "(hf:SRC, char:FILE, ids:N), train on a token store (zoo tokenize declares its "
            "vocabulary), or start from a public checkpoint's tokenizer (model.init_from)"
        )


def _classes_public(data: DataConfig, *, declared: bool, checkpoint: str | None) -> None:
    """A classifier's domain is its class set: listed in the recipe, each once, at least 2."""
    if data.classes is None:
        raise ZooError(
            f"DP run on {data.dataset!r}: the classes would be read off the private labels, so one "
            "record with a new label changes the model; list them in the recipe, e.g. "
            "data.classes = [0, 1, ..., 9]"
        )
    if len({str(c) for c in data.classes}) != len(data.classes) or len(data.classes) < 2:
        raise ZooError(
            f"data.classes = {list(data.classes)} must list at least 2 classes, each once: a DP run "
            "trains one output per listed class"
        )


# What each task's model takes from its domain, checked public (by task name: zoo.data.dataset.TASKS).
_PUBLIC_DOMAIN = {LanguageModel.name: _vocabulary_public, Classify.name: _classes_public}
