"""The examples in the public API's docstrings run and give what they show."""

import doctest
import importlib

import pytest

MODULES = ["hookgraph.core.compiler", "hookgraph.core.graph", "hookgraph.core.discovery", "hookgraph.core.registry"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
