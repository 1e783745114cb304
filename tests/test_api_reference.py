"""docs/api.md (the API reference mkdocstrings generates from the docstrings) names every
public callable and class of the top level, at the module that defines it."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import hookgraph as hg

API = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def test_the_api_reference_names_every_public_function_and_class():
    text = API.read_text(encoding="utf-8")
    shown = {}
    for path in re.findall(r"^::: ([\w.]+)$", text, re.MULTILINE):
        if path.startswith("hookgraph.integrations."):
            continue  # not top-level names; importing them loads lightning and transformers
        module, _, attr = path.rpartition(".")
        shown[id(getattr(importlib.import_module(module), attr))] = path  # what the page documents
    # The errors are listed as members of hookgraph.errors; load_run/open_run are lazy forwarders
    # at the top level, documented where they are defined; so is logit_lens.
    forwarders = {"load_run": "hookgraph.runs.reader.load_run", "open_run": "hookgraph.runner.session.open_run",
                  "logit_lens": "hookgraph.runner.lens.logit_lens"}
    missing = []
    for name in hg.__all__:
        obj = getattr(hg, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue  # ACTIONS, POINTS, __version__: data, described by the guides
        if obj.__module__ == "hookgraph.errors":
            assert re.search(rf"^        - {name}$", text, re.MULTILINE), name
            continue
        if name in forwarders:
            assert forwarders[name] in shown.values(), name
        elif id(obj) not in shown:
            missing.append(f"{name} ({obj.__module__})")
    assert missing == []
