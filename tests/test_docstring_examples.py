"""The examples in specdec's docstrings run and show what they print (doctest).

Every module of the installed package is imported and its examples run; a module
whose optional dependency is missing (torch, llama_cpp, ray) is skipped.  Examples
that need a model file or a cluster say ``# doctest: +SKIP``.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import specdec

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(specdec.__path__, "specdec.")
    if not info.name.endswith("__main__")  # importing it runs the command line
)


def test_the_package_has_examples():
    # the parametrised test below would pass over a package with no examples at all
    examples = 0
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        examples += sum(len(t.examples) for t in doctest.DocTestFinder().find(module))
    assert examples >= 20


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        pytest.skip(f"{name} needs an optional dependency: {error}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"
