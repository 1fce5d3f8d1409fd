"""The examples in the package's docstrings run and print what they show."""

import doctest
import importlib
import pkgutil

import pytest

import fedlearn_edu

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(fedlearn_edu.__path__, "fedlearn_edu.") if not m.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name.startswith("fedlearn_edu.flower"):
        pytest.importorskip("flwr", reason="fedlearn_edu.flower needs the 'flower' extra")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed (see output above)"
