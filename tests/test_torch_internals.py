"""Private PyTorch lives in hookgraph/core/torch_internals.py alone (issue 22).

``test_no_private_torch_outside_the_door`` walks every module of the package and names each
private use elsewhere (file:line and the name); ``test_the_door_uses_only_names_this_torch_has``
lists the private names the door itself uses and checks each against the installed torch, so
a torch upgrade shows which ones broke. The other tests check the probes and fallbacks.
"""

from __future__ import annotations

import ast
import collections
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hookgraph.core import torch_internals as ti

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hookgraph"
DOOR = PACKAGE / "core" / "torch_internals.py"

# Private attributes of torch objects that introspection of classes does not list (set in
# __init__, or on classes this test does not build).
EXPLICIT = frozenset({
    "_orig_mod", "_local_tensor", "_fsdp_param_group", "_fsdp_param_groups", "_get_fsdp_state",
    "_version", "_dynamo_marked_constant", "_is_full_backward_hook", "_parameters", "_buffers",
    "_modules", "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
    "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
    "_post_accumulate_grad_hooks", "_global_forward_hooks", "_C",
})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def torch_private_attributes() -> frozenset[str]:
    """Private attribute names of the torch objects hookgraph handles: modules, tensors,
    parameters, hook handles, DDP, DTensor, FSDP2's module and state, plus EXPLICIT."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    from torch.distributed.tensor import DTensor
    from torch.utils.hooks import RemovableHandle

    objects = [
        nn.Module(), nn.Linear(1, 1), torch.Tensor, nn.Parameter, RemovableHandle,
        RemovableHandle(collections.OrderedDict()), nn.parallel.DistributedDataParallel, DTensor, FSDPModule, FSDPState,
    ]
    names = {n for o in objects for n in dir(o) if _private(n)}
    return frozenset(names | EXPLICIT)


_TORCH_PATH = re.compile(r"torch(\.\w+)+")


def _private_path(dotted: str) -> bool:
    return any(_private(part) for part in dotted.split(".")[1:])


def _set_on_self(tree: ast.AST) -> set[str]:
    """Attribute names assigned on ``self`` anywhere in ``tree`` (``self.a = ...``,
    ``self.a, self.b = ...``, ``self.a: int = ...``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


class _Finder(ast.NodeVisitor):
    """Private torch uses in one module: (line, what)."""

    def __init__(self, private_attrs: frozenset[str]) -> None:
        self.private_attrs = private_attrs
        self.aliases: dict[str, str] = {}  # local name -> the torch module path it names
        self.hits: list[tuple[int, str]] = []
        self.docstrings: set[int] = set()
        self.own: list[set[str]] = []  # per enclosing class: attributes it assigns on self

    def hit(self, node: ast.AST, what: str) -> None:
        self.hits.append((getattr(node, "lineno", 0), what))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name == "torch" or a.name.startswith("torch."):
                if _private_path(a.name):
                    self.hit(node, f"import {a.name}")
                self.aliases[a.asname or "torch"] = a.name if a.asname else "torch"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if mod != "torch" and not mod.startswith("torch."):
            return
        if _private_path(mod):
            self.hit(node, f"from {mod} import ...")
        for a in node.names:
            if _private(a.name):
                self.hit(node, f"from {mod} import {a.name}")
            self.aliases[a.asname or a.name] = f"{mod}.{a.name}"

    def _chain(self, node: ast.expr) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *reversed(parts)])
        return None

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        own = _set_on_self(node)
        own |= {s for n in node.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name) and t.id == "__slots__" for s in ast.literal_eval(n.value)}
        self._docstring(node)
        self.own.append(own)
        self.generic_visit(node)
        self.own.pop()

    def _docstring(self, node: ast.AST) -> None:
        body = getattr(node, "body", [])
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            self.docstrings.add(id(body[0].value))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._docstring(node)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Module(self, node: ast.Module) -> None:
        self._docstring(node)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = self._chain(node)
        if chain is not None:
            if _private(node.attr):
                self.hit(node, chain)
        elif node.attr in self.private_attrs:
            receiver = node.value
            mine = isinstance(receiver, ast.Name) and receiver.id in ("self", "cls") and any(
                node.attr in own for own in self.own
            )
            if not mine:
                self.hit(node, f"{ast.unparse(receiver)}.{node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value in self.private_attrs:
                self.hit(node, f"{f.id}(..., {name.value!r})")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        text = node.value
        if (isinstance(text, str) and id(node) not in self.docstrings and _TORCH_PATH.fullmatch(text)
                and _private_path(text)):
            self.hit(node, repr(text))


def private_uses(path: Path, private_attrs: frozenset[str]) -> list[tuple[int, str]]:
    finder = _Finder(private_attrs)
    finder.visit(ast.parse(path.read_text(), filename=str(path)))
    return sorted(set(finder.hits))


def _modules() -> Iterator[Path]:
    yield from sorted(PACKAGE.rglob("*.py"))


def test_no_private_torch_outside_the_door():
    attrs = torch_private_attributes()
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _modules()
        if path != DOOR
        for line, what in private_uses(path, attrs)
    ]
    assert not found, "private PyTorch outside hookgraph/core/torch_internals.py:\n" + "\n".join(found)


def test_the_finder_sees_each_kind_of_private_use(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        '"""Mentions torch._dynamo in prose, which is fine."""\n'
        "import sys\n"
        "import torch\n"
        "import torch._dynamo\n"
        "import torch.utils._pytree as pytree\n"
        "from torch._dynamo import config\n"
        "from torch import _C, nn\n"
        "x = torch._C._current_graph_task_id\n"
        "y = nn.modules.module._global_forward_hooks\n"
        "def f(m, t):\n"
        "    return m._forward_hooks, t._version, getattr(m, '_orig_mod', None), 'torch._dynamo' in sys.modules\n"
        "class Own:\n"
        "    def __init__(self):\n"
        "        self._version = 0\n"
        "    def bump(self):\n"
        "        return self._version, self._modules\n"
    )
    hits = private_uses(src, torch_private_attributes())
    assert hits == [
        (4, "import torch._dynamo"),
        (5, "import torch.utils._pytree"),
        (6, "from torch._dynamo import ..."),
        (7, "from torch import _C"),
        (8, "torch._C"),
        (8, "torch._C._current_graph_task_id"),
        (9, "torch.nn.modules.module._global_forward_hooks"),
        (11, "'torch._dynamo'"),
        (11, "getattr(..., '_orig_mod')"),
        (11, "m._forward_hooks"),
        (11, "t._version"),
        (16, "self._modules"),  # Own sets _version itself, not _modules
    ]


# -- the door's own names against this torch ----------------------------------------------------


def _door_names() -> tuple[set[str], set[str], set[str]]:
    """(private module paths imported, private names imported from torch modules as
    ``module:name``, private attribute names read off objects) in torch_internals.py."""
    tree = ast.parse(DOOR.read_text())
    modules: set[str] = set()
    imported: set[str] = set()
    attrs: set[str] = set()
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("torch."):
                    aliases[a.asname or "torch"] = a.name if a.asname else "torch"
                    if _private_path(a.name):
                        modules.add(a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
            if _private_path(node.module or ""):
                modules.add(node.module or "")
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                if _private(a.name) or _private_path(node.module or ""):
                    imported.add(f"{node.module}:{a.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            attrs.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"_[a-z]\w*", node.value):
                attrs.add(node.value)  # getattr(obj, "_name") and names kept in constants
            elif _TORCH_PATH.fullmatch(node.value) and _private_path(node.value):
                modules.add(node.value)
    return modules, imported, attrs


@pytest.fixture
def instance_names():
    """Private attribute names of instances the door reads: a compiled wrapper, an FSDP2
    module and its state, a DTensor (a gloo group of one rank, gone before the test runs),
    and a function marked as having a constant result."""
    if not dist.is_gloo_available():  # pragma: no cover - every CI torch has gloo
        pytest.skip("needs gloo")
    if dist.is_initialized():  # pragma: no cover - another test left one
        pytest.skip("a process group is already initialised in this process")
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded = fully_shard(nn.Linear(2, 2))
        dtensor = distribute_tensor(torch.ones(2, 2), init_device_mesh("cpu", (1,)), [Shard(0)])
        objects = [torch.compile(nn.Linear(2, 2)), sharded, sharded._get_fsdp_state(), dtensor, nn.Linear(2, 2),
                   torch.compiler.assume_constant_result(lambda: 0)]
        return {n for o in objects for n in [*dir(o), *getattr(o, "__dict__", {})] if _private(n)}
    finally:
        dist.destroy_process_group()


def test_the_door_uses_only_names_this_torch_has(instance_names):
    modules, imported, attrs = _door_names()
    assert "torch._dynamo" in modules and "_orig_mod" in attrs  # the walk sees the door's uses
    missing = []
    for path in sorted(modules):
        try:
            importlib.import_module(path)
        except ImportError:
            missing.append(f"module {path}")
    for item in sorted(imported):
        mod, _, name = item.partition(":")
        try:
            if not hasattr(importlib.import_module(mod), name):
                missing.append(f"{mod}.{name}")
        except ImportError:
            missing.append(f"module {mod}")
    known = (torch_private_attributes() - EXPLICIT) | instance_names  # EXPLICIT is what we look for, not proof
    known |= {n for n in dir(collections.namedtuple("Pair", "a b")) if _private(n)}  # Python's, not torch's
    known |= {n for mod in (torch, torch._C) for n in dir(mod) if _private(n)}  # module attributes (torch._C._x)
    missing += [f"attribute {n}" for n in sorted(attrs - known - _door_own_names())]
    assert not missing, "torch_internals uses private names this torch lacks:\n" + "\n".join(missing)


def _door_own_names() -> set[str]:
    """Private names torch_internals defines itself: module-level helpers and constants, and
    attributes its classes set on self."""
    tree = ast.parse(DOOR.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    names |= _set_on_self(tree)
    return {n for n in names if n.startswith("_")}


def test_every_probe_finds_the_private_path_on_this_torch():
    found = ti.capabilities()
    assert len(found) == 12
    assert [name for name, ok in found.items() if not ok] == []


# -- fallbacks -----------------------------------------------------------------------------------


def test_the_pytree_fallbacks_judge_as_pytree_does():
    from collections import namedtuple

    pair = namedtuple("Pair", "a b")(1, 2)
    values = [pair, torch.return_types.max((torch.ones(1), torch.zeros(1))), (1, 2), [1], {"a": 1}, torch.ones(1)]
    assert [ti._is_namedtuple(v) for v in values] == [ti.is_namedtuple(v) for v in values] == [
        True, False, False, False, False, False
    ]
    assert [ti._is_structseq(v) for v in values] == [ti.is_structseq(v) for v in values] == [
        False, True, False, False, False, False
    ]


def test_the_public_shard_arithmetic_cuts_what_dtensors_own_does(monkeypatch):
    """Rank 2 of a 2x2 mesh (a fake group: no communication), uneven shapes."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():  # pragma: no cover - another test left one
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=2, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (2, 2))
        full = torch.arange(70.0).reshape(7, 10)
        for placements in ([Shard(0), Shard(1)], [Shard(0), Replicate()], [Shard(1), Shard(0)], [Shard(0), Shard(0)]):
            dtensor = distribute_tensor(full, mesh, placements, src_data_rank=None)
            private = ti.local_slice(full, dtensor)
            with monkeypatch.context() as patch:
                patch.setattr(ti, "_local_shape_and_offset", lambda: None)
                public = ti.local_slice(full, dtensor)
            assert private.shape != full.shape
            torch.testing.assert_close(private, dtensor.to_local())
            torch.testing.assert_close(public, private)
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_current_parameter_reads_a_scripted_module_and_the_public_walk():
    lin = nn.Linear(2, 2)
    assert ti.current_parameter(lin, "weight") is lin.weight
    assert ti.current_parameter(lin, "nothing") is None
    scripted = torch.jit.script(nn.Linear(2, 2))
    assert ti.current_parameter(scripted, "bias") is not None

    class Walkable:  # a module without Module._parameters: the public walk finds its parameter
        weight = nn.Parameter(torch.ones(1))

        def named_parameters(self, recurse=True, remove_duplicate=True):
            assert not recurse and not remove_duplicate
            yield "weight", self.weight

    walkable = Walkable()
    assert ti.current_parameter(walkable, "weight") is Walkable.weight
    assert ti.current_parameter(walkable, "nothing") is None


def test_ddp_unfinished_reduction_is_recognised_by_its_words_alone():
    words = "Expected to have finished reduction in the prior iteration before starting a new one."
    assert ti.ddp_unfinished_reduction(RuntimeError(words))
    assert not ti.ddp_unfinished_reduction(ValueError(words))
    assert not ti.ddp_unfinished_reduction(RuntimeError("CUDA out of memory"))


def test_unsafe_global_names_what_torch_load_refused(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"w": torch.ones(1), "f": Path("x")}, path)
    with pytest.raises(Exception) as caught:
        torch.load(path, weights_only=True)
    name = ti.unsafe_global(path, caught.value)
    assert name is not None and "Path" in name
    assert ti.unsafe_global(tmp_path / "missing.pt", RuntimeError("Unsupported global: GLOBAL a.b")) == "a.b"


def test_marking_a_constant_result_does_not_load_dynamo():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hookgraph.core import torch_internals as ti\n"
        "f = ti.mark_constant_result(lambda: 1)\n"
        "print(f._dynamo_marked_constant, 'torch._dynamo' in sys.modules, ti.dynamo_loaded())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["True", "False", "False"]
