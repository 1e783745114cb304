"""The command line from a user's own folder and --config-dir: each model source and data kind,
numbers checked against hand-written PyTorch on the same seed."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import hookgraph as hg
from tests.cli_helpers import run_cli_here
from tests.user_helpers import GPT2_SMALL, LINES, train_tokenizer, write_mnist

pytestmark = pytest.mark.slow

TINYGPT = """\
name: null
_target_: transformers.GPT2LMHeadModel
kwargs:
  config: {_target_: transformers.GPT2Config, n_layer: 2, n_embd: 64, n_head: 4, vocab_size: 100, n_positions: 32}
"""


def user_folder(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def cli(root: Path, *args: str) -> hg.Run:
    proc = run_cli_here(["--config-dir", "conf", *args, "sink.figures=false", "runner.progress=false",
                    "runner.device=cpu", f"hydra.run.dir={root / 'run'}"], cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return hg.load_run(root / "run")


def losses(root: Path) -> list[float]:
    return json.loads((root / "run" / "summary.json").read_text())["losses"]


def gpt2(seed: int = 0, **extra):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**GPT2_SMALL, **extra)).eval()


def hand_records(model: torch.nn.Module, names: list[str], batches: list[dict]) -> dict[str, list[torch.Tensor]]:
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    handles = [model.get_submodule(n).register_forward_hook(lambda m, a, out, n=n: seen[n].append(out.detach()))
               for n in names]
    try:
        for batch in batches:
            model(**batch).logits.sum().backward()
            model.zero_grad()
    finally:
        for h in handles:
            h.remove()
    return seen


def test_gpt2_tiny_on_tokens_records_what_hand_written_hooks_see(tmp_path):
    pytest.importorskip("transformers")
    root = user_folder(
        tmp_path, {"conf/hooks/mlp_out.yaml": "mlp_out: {target: 'transformer.h.*.mlp', at: forward, action: record}\n"}
    )
    run = cli(
        root,
        "model=gpt2_tiny",
        "data=tokens",
        "hooks=[mlp_out]",
        "runner.batch_size=2",
        "runner.steps=2",
        "data.seq_len=8",
    )
    gen = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 100, (2, 8), generator=gen)} for _ in range(2)]
    names = ["transformer.h.0.mlp", "transformer.h.1.mlp"]
    mine = hand_records(gpt2(0, bos_token_id=0, eos_token_id=0), names, batches)
    assert sorted(run.records["mlp_out"]) == names
    for n in names:
        got = run.records["mlp_out"][n]
        assert len(got) == 2 and all(torch.allclose(g, m, atol=1e-6) for g, m in zip(got, mine[n], strict=True))


def test_users_gpt2_config_on_text_with_the_lm_loss(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    root = user_folder(tmp_path, {"conf/model/tinygpt.yaml": TINYGPT, "lines.txt": "\n".join(LINES) + "\n"})
    train_tokenizer(root / "tok")
    run = cli(
        root,
        "model=tinygpt",
        "data=text",
        "data.path=lines.txt",
        "data.tokenizer=tok",
        "runner.loss=lm",
        "runner.batch_size=2",
        "runner.steps=2",
        "runner.seed=7",
        "hooks=[]",
        "+hooks.attn={target: transformer.h.0.attn, at: forward, action: record, index: 0}",
    )
    model = gpt2(7)
    tok = transformers.AutoTokenizer.from_pretrained(str(root / "tok"))
    expected, shapes = [], []
    for chunk in (LINES[:2], LINES[2:]):
        enc = tok(chunk, padding=True, truncation=True, max_length=32, return_tensors="pt")
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)  # padding predicts nothing
        with torch.no_grad():
            expected.append(float(model(**enc, labels=labels).loss))
        shapes.append((2, enc["input_ids"].shape[1], 64))
    assert losses(root) == pytest.approx(expected, rel=1e-5)
    got = run.records["attn"]["transformer.h.0.attn"]
    assert [tuple(g.shape) for g in got] == shapes == [(2, 6, 64), (2, 9, 64)]


def test_custom_dict_dataset_with_the_models_own_loss(tmp_path):
    pytest.importorskip("transformers")
    root = user_folder(
        tmp_path,
        {
            "conf/model/tinygpt.yaml": TINYGPT,
            "mydata.py": """\
            import torch
            from torch.utils.data import Dataset

            class Tokens(Dataset):
                def __init__(self, n, seq_len):
                    self.ids = torch.randint(0, 100, (n, seq_len), generator=torch.Generator().manual_seed(3))
                def __len__(self):
                    return len(self.ids)
                def __getitem__(self, i):
                    return {"input_ids": self.ids[i], "labels": self.ids[i]}
            """,
        },
    )
    cli(
        root,
        "model=tinygpt",
        "data=custom",
        "data._target_=mydata.Tokens",
        "+data.kwargs.n=6",
        "+data.kwargs.seq_len=5",
        "runner.loss=model",
        "runner.batch_size=3",
        "runner.steps=3",
        "hooks=[]",
    )
    ids = torch.randint(0, 100, (6, 5), generator=torch.Generator().manual_seed(3))
    model = gpt2(0)
    with torch.no_grad():
        expected = [
            float(model(input_ids=ids[i : i + 3], labels=ids[i : i + 3]).loss) for i in (0, 3, 0)
        ]  # then it cycles
    assert losses(root) == pytest.approx(expected, rel=1e-5)


def test_torchvision_mnist_from_idx_files_with_a_users_model(tmp_path):
    root = user_folder(
        tmp_path,
        {
            "conf/model/mnist_net.yaml": "name: null\n_target_: mynet.Net\nkwargs: {hidden: 16}\n",
            "mynet.py": """\
            from torch import nn

            class Net(nn.Module):
                def __init__(self, hidden):
                    super().__init__()
                    self.fc1 = nn.Linear(784, hidden)
                    self.fc2 = nn.Linear(hidden, 10)
                def forward(self, x):
                    return self.fc2(self.fc1(x.flatten(1)).relu())
            """,
        },
    )
    images, labels = write_mnist(root / "mnist")
    run = cli(
        root,
        "model=mnist_net",
        "data=torchvision",
        "data.name=MNIST",
        "data.root=mnist",
        "runner.loss=cross_entropy",
        "runner.batch_size=3",
        "runner.steps=2",
        "hooks=[]",
        "+hooks.h={target: fc1, action: record}",
    )
    sys.path.insert(0, str(root))
    try:
        from mynet import Net
    finally:
        sys.path.remove(str(root))
    torch.manual_seed(0)
    model = Net(16).eval()
    x = images.float().unsqueeze(1) / 255
    with torch.no_grad():
        expected = [float(F.cross_entropy(model(x[i : i + 3]), labels[i : i + 3])) for i in (0, 3)]
    assert losses(root) == pytest.approx(expected, rel=1e-5)
    got = run.records["h"]["fc1"]
    assert torch.allclose(got[1], model.fc1(x[3:6].flatten(1)).detach(), atol=1e-6)


def test_timm_model_by_name(tmp_path):
    timm = pytest.importorskip("timm")
    root = user_folder(
        tmp_path,
        {"conf/hooks/attn_proj.yaml": "attn_proj: {target: 'blocks.*.attn.proj', at: forward, action: record}\n"},
    )
    run = cli(
        root,
        "model=timm",
        "model.name=vit_tiny_patch16_224",
        "+model.kwargs.img_size=32",
        "+model.kwargs.patch_size=8",
        "+model.kwargs.depth=2",
        "data=random",
        "data.shape=[3,32,32]",
        "runner.batch_size=2",
        "hooks=[attn_proj]",
    )
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    seen = []
    h = model.blocks[1].attn.proj.register_forward_hook(lambda m, a, out: seen.append(out.detach()))
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        h.remove()
    assert sorted(run.records["attn_proj"]) == ["blocks.0.attn.proj", "blocks.1.attn.proj"]
    assert torch.allclose(run.records["attn_proj"]["blocks.1.attn.proj"][0], seen[0], atol=1e-5)
    assert losses(root) == pytest.approx([float(out.sum())], rel=1e-4, abs=1e-3)


def test_from_pretrained_with_a_local_folder(tmp_path):
    pytest.importorskip("transformers")
    gpt2(21).save_pretrained(str(tmp_path / "ckpt"))
    root = user_folder(
        tmp_path,
        {
            "conf/model/mine.yaml": """\
        name: null
        _target_: transformers.AutoModelForCausalLM.from_pretrained
        kwargs: {pretrained_model_name_or_path: ckpt}
        """
        },
    )
    run = cli(
        root,
        "model=mine",
        "data=tokens",
        "data.seq_len=4",
        "hooks=[]",
        "+hooks.m={target: transformer.h.1.mlp, action: record}",
    )
    ids = torch.randint(0, 100, (1, 4), generator=torch.Generator().manual_seed(0))
    mine = hand_records(gpt2(21), ["transformer.h.1.mlp"], [{"input_ids": ids}])
    assert torch.allclose(run.records["m"]["transformer.h.1.mlp"][0], mine["transformer.h.1.mlp"][0], atol=1e-6)


def test_a_missing_optional_package_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    root = user_folder(
        tmp_path, {"fake/timm/__init__.py": "raise ModuleNotFoundError(\"No module named 'timm'\", name='timm')\n"}
    )
    # In this process: the fake timm first on the path, and a timm another test imported out of
    # the way (monkeypatch puts both back); the message and exit code are the entry point's.
    monkeypatch.syspath_prepend(str(root / "fake"))
    monkeypatch.delitem(sys.modules, "timm", raising=False)
    proc = run_cli_here(["model=timm", f"hydra.run.dir={root / 'run'}"], cwd=root)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    (at,) = [i for i, ln in enumerate(lines) if ln.startswith("hookgraph: error")]
    line = lines[at]
    assert lines[at + 1].startswith("(run folder:")  # the whole message is one line
    assert "model._target_: cannot import 'timm.create_model'" in line and "pip install 'hookgraph[timm]'" in line
