"""``python-docs``: the text of CPython's bundled ``pydoc_data.topics``, for language models."""

from __future__ import annotations

import functools

from zoo.data.table import Source, register_builtin

DOCUMENT_SEPARATOR = "\n\n"  # between topics


@functools.cache
def read_python_docs() -> Source:
    from pydoc_data.topics import topics

    import datasets

    rows = datasets.Dataset.from_dict({"text": [topics[k] for k in sorted(topics)]})
    return Source(rows, "text", "image", "label", separator=DOCUMENT_SEPARATOR)


register_builtin(
    "python-docs", "lm", read_python_docs, description="text of CPython's bundled pydoc_data.topics"
)
