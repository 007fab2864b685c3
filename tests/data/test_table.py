"""The dataset table (``zoo.data.table``): a new dataset is one module of ``zoo.data.forms``.

A toy module written here into a temporary folder that joins ``zoo.data.forms``'s search path,
with no other file edited, registers a dataset known by name and a scheme; both are listed in
``zoo train --help`` and in the "unknown dataset" error, and load like any other form."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import zoo.data.forms
from zoo.cli import main
from zoo.data import DatasetError, load_dataset, table
from zoo.data.hub import offline_error

MODULE = "toyforms"  # a module name no shipped form uses

TOY = '''
    """Two toy rows for tests/data/test_table.py: a named dataset and a scheme."""

    import functools

    from zoo.data.table import DatasetForm, Source, register_builtin, register_form


    def rows(n):
        import datasets

        return datasets.Dataset.from_dict(
            {"a": [float(i % 7) for i in range(n)], "b": [float(i % 3) for i in range(n)],
             "label": [i % 2 for i in range(n)]}
        )


    @functools.cache
    def read_toyset():
        return Source(rows(40), "text", "image", "label")


    def read_toyrows(spec, rest, columns):
        return Source(rows(int(rest)), columns.text, columns.image, columns.label)


    register_builtin("toyset", "classify", read_toyset, description="40 toy rows of two features")
    register_form(DatasetForm("toyrows", "toyrows:N", ("classify",), read_toyrows, "N toy rows", True))
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy module, found by ``table.import_forms`` as ``zoo.data.forms.toyforms``;
    unregistered and forgotten afterwards."""
    root = tmp_path_factory.mktemp("forms")
    (root / f"{MODULE}.py").write_text(textwrap.dedent(TOY).lstrip())
    assert "toyset" not in table.dataset_kinds()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zoo.data.forms, "__path__", [*zoo.data.forms.__path__, str(root)])
        found = table.import_forms()
        try:
            yield found
        finally:
            table.unregister("toyset")
            table.unregister("toyrows")
            sys.modules.pop(f"zoo.data.forms.{MODULE}", None)
    assert "toyset" not in table.dataset_kinds() and "toyrows:N" not in table.dataset_kinds()


def test_the_module_is_found_and_its_rows_listed_with_the_shipped_ones(toy):
    assert MODULE in toy and {"digits", "mnist", "python_docs", "schemes", "spiral"} <= set(toy)
    rows = table.forms()  # the names, then the schemes, each in name order
    names = [f.usage for f in rows if not f.is_scheme]
    assert names == sorted(names) and names[0] == "digits" and names[-1] == "toyset"
    assert [f.name for f in rows if f.is_scheme] == [
        "bin", "csv", "hf", "idx", "parquet", "text", "tokens", "toyrows"
    ]  # fmt: skip
    assert table.dataset_kinds() == (*names, "bin:PATH[,EVAL_PATH]", "csv:PATH", "hf:NAME[:CONFIG]",
                                     "idx:DIR", "parquet:PATH", "text:PATH[,PATH...]", "tokens:DIR",
                                     "toyrows:N")  # fmt: skip


def test_the_rows_show_in_the_cli_help_and_the_unknown_dataset_error(toy, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert all(kind.replace(" ", "") in shown.replace(" ", "") for kind in table.dataset_kinds())
    assert "toyset" in shown and "toyrows:N" in shown
    with pytest.raises(DatasetError, match=r"Did you mean 'toyset'\?.*Valid forms: .*toyset.*toyrows:N"):
        load_dataset("toyst", task="classify")
    with pytest.raises(DatasetError, match=r"Did you mean 'toyrows:12'\?"):
        load_dataset("toyrow:12", task="classify")
    assert "toyrows:N" in str(offline_error("hf:x", "no network"))  # an offline form


def test_the_rows_load_and_keep_to_their_task(toy):
    ds = load_dataset("toyset", task="classify", seed=0, eval_fraction=0.25)
    assert (ds.num_train, ds.num_eval, ds.num_classes, ds.num_features) == (30, 10, 2, 2)
    x = np.concatenate([ds.x_train, ds.x_eval])
    assert sorted(x[:, 1].tolist()) == sorted(float(i % 3) for i in range(40))
    assert load_dataset("toyrows:12", task="classify", eval_fraction=0.25).num_train == 9
    with pytest.raises(DatasetError, match="supports only task='classify'"):
        load_dataset("toyrows:12", task="lm")


def test_a_row_is_checked_when_registered():
    read = lambda: None  # noqa: E731
    with pytest.raises(ValueError, match="taken"):
        table.register_builtin("digits", "classify", read, description="a second digits")
    with pytest.raises(ValueError, match="unknown task"):
        table.register_builtin("toy-regress", "regress", read, description="a regression set")
    with pytest.raises(ValueError, match="one-line description"):
        table.register_builtin("toy-blank", "classify", read, description=" ")
    with pytest.raises(ValueError, match="':'"):
        table.register_builtin("toy:x", "classify", read, description="a name with a colon")
    assert not {"toy-regress", "toy-blank", "toy:x"} & set(table.dataset_kinds())


def test_listing_the_forms_does_not_import_datasets():
    code = (
        "import sys; from zoo.cli import build_parser; build_parser('train'); "
        "from zoo.data.table import dataset_kinds; assert 'digits' in dataset_kinds(); "
        "print('datasets' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr


def test_the_docs_table_lists_every_form_and_whether_it_needs_a_network():
    text = (Path(__file__).parents[2] / "docs" / "recipes.md").read_text()
    section = text.split("## Datasets", 1)[1].split("\n## ", 1)[0]
    offline = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            for spec in re.findall(r"`([^`]+)`", cells[0]):
                offline[spec] = cells[2] == "yes"
    shipped = [f for f in table.forms() if f.name not in ("toyset", "toyrows")]  # the toy may still be there
    assert offline == {f.usage: f.offline for f in shipped}
