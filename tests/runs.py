"""Runner configs the tests share, and run folders written in-process as the command line writes them.

Public names: compose, mlp_cfg, cfg, tiny_records, shard_holds, strict_json, make_run, conv_names_of, CPU, PaddedTokens,
run_two_ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

import hookgraph as hg
from hookgraph.report import module_tree
from hookgraph.runner import build_from_config, register_configs, run
from hookgraph.runs.writer import RunWriter, shard_key

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
ROOT = Path(__file__).resolve().parents[1]
# gloo on the loopback interface only: its sockets never bind another one.
LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo"} if Path("/sys/class/net/lo").exists() else {}


def run_two_ranks(worker: str, tmp_path: Path, timeout: float = 120) -> list[str]:
    """``python -m <worker> RANK 2 <tmp_path>/store <tmp_path>/RANK`` for ranks 0 and 1 (a file
    store rendezvous, gloo on 127.0.0.1): both must exit 0 within ``timeout``; their outputs.
    A worker still running afterwards is killed."""
    env = {**os.environ, **LOOPBACK, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", worker, str(r), "2", str(tmp_path / "store"), str(tmp_path / f"{r}")],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for r in range(2)
    ]  # fmt: skip
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    return logs


def launch_torchrun(module: str, *args: str, timeout: float, cwd: Path = ROOT,
                    env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """``torchrun --nproc_per_node=2 -m <module> <args>`` in a process group of its own (c10d
    rendezvous on 127.0.0.1, any free port), with the caller's torchrun variables cleared and
    ``env`` added: the ended process and its output; the test fails, its group killed, when it
    does not end within ``timeout`` s."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv-backend=c10d",
           "--rdzv-endpoint=127.0.0.1:0", "--max-restarts=0", "-m", module, *args]
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        full.pop(k, None)
    proc = subprocess.Popen(cmd, cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"torchrun did not end within {timeout:g} s")
    return proc, output


def torchrun_two(worker: str, *args: str, timeout: float = 180) -> str:
    """:func:`launch_torchrun` of ``worker``, which must exit 0; its output."""
    proc, output = launch_torchrun(worker, *args, timeout=timeout)
    assert proc.returncode == 0, output[-3000:]
    return output


CPU = ("runner.device=cpu", "runner.progress=false")


def compose(*overrides: str):
    """The packaged config with command-line style overrides, as ``python -m hookgraph`` sees it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def mlp_cfg(hooks: dict, **sections) -> dict:
    """A small runner config: the seeds' MLP on random (16,) inputs, no figures."""
    cfg: dict[str, Any] = {
        "model": {"name": "mlp"},
        "runner": {"device": "cpu", "progress": False},
        "sink": {"figures": False},
        "hooks": hooks,
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    return cfg


def cfg(**sections):
    """A small runner config: the seeds' conv_net recording ``conv``, no figures. A dict
    section is merged into the default one; ``hooks`` and non-dict values replace it."""
    base = {"model": {"name": "conv_net"}, "runner": {"progress": False}, "sink": {"figures": False},
            "hooks": {"acts": {"target": "conv", "action": "record"}}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) and key != "hooks" else value
    return base


def shard_digest(data: bytes) -> str:
    """The manifest digest of a new shard's bytes, computed here without hookgraph: XXH3-128
    by the xxhash package where it is installed, else SHA-256 by hashlib, tagged."""
    try:
        import xxhash  # lazy: optional, as in the writer
    except ImportError:
        import hashlib  # lazy: only without xxhash

        return "sha256:" + hashlib.sha256(data).hexdigest()
    return "xxh3_128:" + xxhash.xxh3_128(data).hexdigest()


def tiny_records(tmp_path: Path, n: int) -> tuple[RunWriter, dict, dict]:
    """A RunWriter in ``tmp_path`` with step 0 written (its imports and caches are not what a test
    of step 1 measures), and ``n`` seeded [1, 4] records of spec ``s`` for step 1: (writer, the
    records to flush, a copy of each target's tensor to check the shard against)."""
    torch.manual_seed(0)
    records = {"s": {f"layers.{i}": [torch.randn(1, 4)] for i in range(n)}}
    kept = {k: v[0].clone() for k, v in records["s"].items()}
    writer = RunWriter(tmp_path)
    writer.flush_records({"warm": {"a": [torch.ones(1)]}}, 0)
    return writer, records, kept


def shard_holds(path: Path, kept: dict) -> bool:
    """Whether the step-1 shard at ``path`` holds exactly ``kept``'s targets of spec ``s``, equal."""
    from safetensors.torch import load_file  # lazy: as the writer's readers

    written = load_file(path)
    return len(written) == len(kept) and all(torch.equal(written[shard_key("s", k, 1, 0)], v) for k, v in kept.items())


def strict_json(path: Path) -> dict:
    """The JSON file at ``path``, refusing NaN and Infinity (which json.loads accepts)."""

    def refuse(token: str) -> None:
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(path.read_text(), parse_constant=refuse)


def make_run(out: Path, *overrides: str, modules: bool = True, fails: bool = False) -> Path:
    """A run folder written by hookgraph.runner.run, with .hydra/overrides.yaml as Hydra
    writes it and, with ``modules``, modules.json as the runner will write it. With
    ``fails``, the run must raise a HookGraphError (its folder stays, as on the command line)."""
    config = compose(*overrides, *CPU)
    try:
        run(config, out)
    except hg.HookGraphError:
        if not fails:
            raise
    else:
        assert not fails, "the run was expected to fail"
    (out / ".hydra").mkdir(exist_ok=True)
    (out / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    if modules:
        assert json.loads((out / "modules.json").read_text()) == module_tree(build_from_config(config))
    else:  # a folder written before the runner wrote modules.json
        (out / "modules.json").unlink()
    return out


def conv_names_of(*overrides: str) -> list[str]:
    """Names of the Conv2d modules of the model the packaged config builds with ``overrides``."""
    model = build_from_config(compose(*overrides, *CPU))
    return [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]


class PaddedTokens:
    """A map-style dataset of ``{"input_ids", "attention_mask"}`` items, right- and left-padded
    rows alternating (``rows`` items of ``seq`` tokens, ids seeded): the runner's batches as a
    tokenizer with padding gives them."""

    def __init__(self, rows: int = 6, seq: int = 8, vocab: int = 100):
        gen = torch.Generator().manual_seed(1)
        self.ids = torch.randint(1, vocab, (rows, seq), generator=gen)
        self.mask = torch.ones(rows, seq, dtype=torch.long)
        for i in range(rows):
            pad = i % (seq // 2)
            if i % 2:
                self.mask[i, seq - pad:] = 0  # right padding
            else:
                self.mask[i, :pad] = 0  # left padding
        self.ids[self.mask == 0] = 0

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}
