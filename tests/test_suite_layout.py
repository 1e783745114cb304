"""The test suite's own layout: a test module never imports another test module (nor
conftest). What tests share lives in helper modules (models.py, runs.py, globs.py, ...) and
fixtures in conftest.py; a ``_target_`` string may name a test module only from inside it."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

from tests.schedule import SLOWEST_FIRST, slowest_first

TESTS = Path(__file__).resolve().parent
_TEST_MODULE = re.compile(r"(?:^|\.)(test_\w+|conftest)$")
_TARGET = re.compile(r"\btests\.(test_\w+)\.")


def imported_test_modules(source: str, own: str) -> list[str]:
    """What ``source`` (the test module ``own``) imports of other test modules or conftest:
    ``import tests.test_x``, ``from tests.test_x import y``, ``from .test_x import y``,
    ``from tests import test_x``, and ``_target_`` strings such as ``"tests.test_x.Model"``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _TEST_MODULE.search(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if _TEST_MODULE.search(module):
                found.append(module)
            elif module in ("tests", "."):
                found += [f"{module}.{a.name}".replace("..", ".") for a in node.names if _TEST_MODULE.search(a.name)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [m.group(0) for m in _TARGET.finditer(node.value) if m.group(1) != own]
    return found


def test_no_test_module_imports_another():
    # This module itself is left out: its example below spells every form the check finds.
    found = {
        p.name: imported_test_modules(p.read_text(), p.stem)
        for p in sorted(TESTS.glob("test_*.py"))
        if p.name != Path(__file__).name
    }
    assert {name: imports for name, imports in found.items() if imports} == {}
    assert len(found) > 40  # the glob found the suite


def test_the_check_finds_each_way_of_importing_a_test_module():
    source = (
        "import tests.test_a\n"
        "from tests.test_b import x\n"
        "from .test_c import y\n"
        "from tests import test_d, models\n"
        "from tests.conftest import hook_snapshot\n"
        "from tests.models import mlp\n"
        "def f():\n"
        "    from . import conftest\n"
        "    return {'_target_': 'tests.test_e.Model', 'own': 'tests.test_self.Model'}\n"
    )
    assert sorted(imported_test_modules(source, "test_self")) == [
        ".conftest", ".test_c", "tests.conftest", "tests.test_a", "tests.test_b", "tests.test_d", "tests.test_e."
    ]


def test_the_slowest_first_ranking_names_files_of_the_suite():
    # A renamed or deleted file would drop out of the ranking without a word (tests/schedule.py).
    missing = [name for name in SLOWEST_FIRST if not (TESTS / name).is_file()]
    assert missing == [] and len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST) > 0


def test_slowest_first_puts_the_ranked_files_first_and_keeps_each_files_order():
    items = [SimpleNamespace(path=TESTS / f, name=n) for f, n in
             [("test_a.py", "a1"), ("test_b.py", "b1"), ("test_c.py", "c1"), ("test_a.py", "a2"), ("test_c.py", "c2")]]
    slowest_first(items, ranking=("test_c.py", "test_b.py"))  # type: ignore[arg-type]
    assert [i.name for i in items] == ["c1", "c2", "b1", "a1", "a2"]
