"""Records at scale: reductions at record time, shards streamed per step, the record
budget, lazy reading, fused statistics and the TensorBoard sink."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.data import build_data
from hookgraph.models.seeds import MLP
from hookgraph.runner import build_from_config, run
from tests.runs import mlp_cfg


def conv_site():
    """A conv layer whose output is [2, 4, 5, 6], hooked as '0'."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1))
    x = torch.randn(2, 3, 5, 6)
    return model, x, model(x).detach()


# -- reductions at record time -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"reduce": "mean", "dims": [2, 3]}, lambda y: y.mean(dim=(2, 3))),
        ({"reduce": "max", "dims": [0, 2, 3]}, lambda y: y.amax(dim=(0, 2, 3))),
        ({"reduce": "norm", "dims": [-1]}, lambda y: torch.linalg.vector_norm(y, dim=-1)),
        ({"reduce": "mean"}, lambda y: y.mean()),
        ({"select": "0:2"}, lambda y: y[:, 0:2]),
        ({"select": "1:", "dim": 0}, lambda y: y[1:]),
        ({"select": "::2", "dim": -1}, lambda y: y[..., ::2]),
        ({"select": 3}, lambda y: y[:, 3]),
        ({"select": "0:2", "reduce": "mean", "dims": [2, 3]}, lambda y: y[:, 0:2].mean(dim=(2, 3))),
        (
            {"select": 0, "dim": 0, "reduce": "max", "dims": [1, 2], "dtype": "float16"},
            lambda y: y[0].amax(dim=(1, 2)).half(),
        ),
    ],
    ids=[
        "mean-per-channel",
        "max-per-channel",
        "norm-last",
        "mean-all",
        "slice",
        "slice-dim0",
        "step",
        "index",
        "slice+mean",
        "index+max+fp16",
    ],
)
def test_record_reductions_match_torch(args, expected):
    model, x, y = conv_site()
    graph = hg.compile(model, {"r": {"target": "0", "action": "record", "args": args}})
    with graph.attach():
        model(x)
    got = graph.records["r"]["0"][0]
    want = expected(y)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_record_topk_keeps_signed_values_and_indices_along_dim():
    model, x, y = conv_site()
    graph = hg.compile(model, {"r": {"target": "0", "action": "record", "args": {"topk": 3}}})
    with graph.attach():
        model(x)
    got = graph.records["r"]["0"][0]
    want = y.abs().topk(3, dim=1).indices  # per sample and position, along the channels
    assert set(got) == {"values", "indices"}
    assert torch.equal(got["indices"], want)
    assert torch.equal(got["values"], y.gather(1, want))
    assert (got["values"].abs() >= y.abs().sort(dim=1, descending=True).values[:, 2:3]).all()


def test_reduced_records_are_small_and_do_not_alias_the_activation():
    model, x, y = conv_site()
    graph = hg.compile(model, {"r": {"target": "0", "action": "record", "args": {"select": "0:1"}}})
    with graph.attach():
        out = model(x)
    kept = graph.records["r"]["0"][0]
    # A copy of the slice: the full activation's storage is not kept alive by the record.
    assert kept.untyped_storage().nbytes() == kept.numel() * kept.element_size() == 2 * 1 * 5 * 6 * 4
    assert kept.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"reduce": "sum"}, ["reduce", "mean, max, norm", "'sum'"]),
        ({"dims": [2, 3]}, ["dims", "without reduce"]),
        ({"reduce": "mean", "dims": [2, 2]}, ["dims", "distinct"]),
        ({"select": "a:b"}, ["select", "'a:b'"]),
        ({"select": "0:8:-1"}, ["select", "step must be > 0"]),
        ({"select": "3"}, ["select", "slice string"]),
        ({"topk": 0}, ["topk", ">= 1"]),
    ],
)
def test_bad_reduction_args_are_spec_errors_at_compile_time(args, words):
    model, _, _ = conv_site()
    with pytest.raises(hg.SpecError) as err:
        hg.compile(model, {"r": {"target": "0", "action": "record", "args": args}})
    (problem,) = err.value.problems
    assert problem.key == "hooks.r.args"
    for w in words:
        assert w in problem.message


def test_reduction_that_does_not_fit_the_value_names_target_and_shape():
    model, x, _ = conv_site()
    graph = hg.compile(model, {"r": {"target": "0", "action": "record", "args": {"reduce": "mean", "dims": [5]}}})
    with pytest.raises(hg.HookGraphError) as err, graph.attach():
        model(x)
    msg = str(err.value)
    assert "'0'" in msg and "[2, 4, 5, 6]" in msg and "reduce=mean" in msg
    assert not graph.attached


def test_select_dim_out_of_range_is_not_wrapped_onto_another_dim():
    model, x, _ = conv_site()
    graph = hg.compile(model, {"r": {"target": "0", "action": "record", "args": {"select": "0:1", "dim": 4}}})
    with pytest.raises(hg.HookGraphError, match=r"dim 4 is out of range for a value with 4 dimensions"), graph.attach():
        model(x)


# -- streaming, failure and budget --------------------------------------------


class FailsAtStep2(MLP):
    """The seeds' MLP, raising in its third forward (step 2), before any hook runs."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("boom at step 2")
        return super().forward(x)


def _fc1_outputs(cfg: dict, steps: int) -> list[torch.Tensor]:
    """fc1's output per step, computed without hookgraph, for the same model and data."""
    model = build_from_config(cfg)
    batches = build_data("random", shape=(16,), batch_size=1, seed=0).take(steps)
    with torch.no_grad():
        return [model.fc1(inputs[0]) for inputs, _ in batches]


def test_shards_are_written_per_step(tmp_path):
    cfg = mlp_cfg({"r": {"target": "fc1", "action": "record"}}, runner={"steps": 3})
    summary = run(cfg, tmp_path)
    shards = sorted(p.name for p in (tmp_path / "records").glob("*.safetensors"))
    assert shards == ["step-000000.safetensors", "step-000001.safetensors", "step-000002.safetensors"]
    assert summary["shards"] == shards
    loaded = hg.load_run(tmp_path).records["r"]["fc1"]
    for got, want in zip(loaded, _fc1_outputs(cfg, 3), strict=True):
        torch.testing.assert_close(got, want)


def test_a_run_failing_at_step_2_keeps_the_earlier_steps(tmp_path):
    cfg = mlp_cfg(
        {"r": {"target": "fc1", "action": "record"}},
        model={"name": None, "_target_": f"{__name__}.FailsAtStep2"},
        runner={"steps": 3},
    )
    with pytest.raises(RuntimeError, match="boom at step 2"):
        run(cfg, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 2
    assert summary["error"] == {
        "type": "RuntimeError",
        "message": "boom at step 2",
        "where": "step 2, in the model's forward, batch: inputs (float32[1, 16]), labels int64[1], "
        "last module entered the model itself (FailsAtStep2)",
    }
    assert sorted(p.name for p in (tmp_path / "records").glob("*.safetensors")) == [
        "step-000000.safetensors",
        "step-000001.safetensors",
    ]
    want = _fc1_outputs(mlp_cfg({}), 2)
    records = hg.load_run(tmp_path).records["r"]
    assert records.calls("fc1") == [(0, 0), (1, 0)]
    torch.testing.assert_close(records["fc1"][0], want[0])
    torch.testing.assert_close(records["fc1"][1], want[1])


def test_record_budget_trips_at_step_1_and_step_0_stays_readable(tmp_path):
    # fc1's output is [1, 32] float32: 128 bytes a step, so 200 bytes admit step 0 only.
    cfg = mlp_cfg(
        {"r": {"target": "fc1", "action": "record"}, "s": {"target": "fc1", "action": "stats"}},
        runner={"steps": 3},
        sink={"max_bytes": 200},
    )
    with pytest.raises(hg.RecordBudgetError) as err:
        run(cfg, tmp_path)
    msg = str(err.value)
    assert "sink.max_bytes=200" in msg and "at step 1" in msg and "256" in msg
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"] == {"type": "RecordBudgetError", "message": msg}
    assert summary["shards"] == ["step-000000.safetensors"] and summary["records_bytes"] == 128
    back = hg.load_run(tmp_path)
    assert back.records["r"].calls("fc1") == [(0, 0)]
    torch.testing.assert_close(back.records["r"]["fc1"][0], _fc1_outputs(cfg, 1)[0])
    # The stats table is still written after the budget trips (steps 0 and 1 ran their hooks).
    assert [r["step"] for r in back.stats] == [0, 1]


def test_load_run_reads_only_the_target_asked_for(tmp_path, monkeypatch):
    import hookgraph.runs.shards as reader  # where the shard reads live

    run(mlp_cfg({"r": {"target": ["fc1", "fc2", "head"], "action": "record"}}, runner={"steps": 2}), tmp_path)
    read: list[str] = []
    real_read = reader._read_tensors

    def counting_read(shard, items):  # every tensor read from disk passes here
        read.extend(t.key for t in items)
        return real_read(shard, items)

    monkeypatch.setattr(reader, "_read_tensors", counting_read)
    records = hg.load_run(tmp_path).records
    assert sorted(records["r"]) == ["fc1", "fc2", "head"] and read == []  # indexing reads headers only
    fc2 = records["r"]["fc2"]
    assert read == ["r/fc2/0/0", "r/fc2/1/0"]
    assert [tuple(t.shape) for t in fc2] == [(1, 32), (1, 32)]
    records["r"]["fc2"]  # cached: no second read
    assert len(read) == 2
    one = records["r"].entry("head", step=1)
    assert read[2:] == ["r/head/1/0"] and one.shape == (1, 10)


# -- statistics ------------------------------------------------------------------


def _stats_of(x: torch.Tensor) -> dict:
    model = nn.Sequential(nn.Identity())
    graph = hg.compile(model, {"s": {"target": "0", "action": "stats"}})
    with graph.attach():
        model(x)
    (row,) = graph.stats
    return row


def test_fused_stats_match_separate_reductions():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 16) * 3 + 1
    x[0, 0, :5] = 0
    row = _stats_of(x)
    std, mean = torch.std_mean(x, correction=0)
    want = {
        "mean": mean.item(),
        "std": std.item(),
        "min": x.min().item(),
        "max": x.max().item(),
        "absmax": x.abs().max().item(),
        "norm": torch.linalg.vector_norm(x).item(),
        "zero_frac": 5 / x.numel(),
        "nan": 0.0,
        "inf": 0.0,
    }
    assert row["spec"] == "s" and row["target"] == "0" and row["step"] == 0 and row["call"] == 0
    for k, v in want.items():
        assert row[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


def test_fused_stats_count_nan_and_inf_and_keep_an_infinite_norm():
    row = _stats_of(torch.tensor([float("inf"), 1.0, 0.0, -2.0]))
    assert row["norm"] == math.inf and row["absmax"] == math.inf
    assert (row["inf"], row["nan"], row["zero_frac"], row["min"]) == (1.0, 0.0, 0.25, -2.0)
    row = _stats_of(torch.tensor([float("nan"), 1.0, 2.0, 3.0], dtype=torch.float16))
    assert row["nan"] == 1.0 and row["inf"] == 0.0 and math.isnan(row["mean"])


# -- TensorBoard -----------------------------------------------------------------


def test_tensorboard_sink_writes_stats_scalars_and_record_histograms(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = mlp_cfg(
        {"r": {"target": "fc1", "action": "record"}, "s": {"target": "fc1", "action": "stats"}},
        runner={"steps": 2},
        sink={"tensorboard": True},
    )
    run(cfg, tmp_path)
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    stats = hg.load_run(tmp_path).stats
    scalars = acc.Scalars("s/fc1/mean")
    assert [e.step for e in scalars] == [0, 1]
    assert [e.value for e in scalars] == pytest.approx([r["mean"] for r in stats], rel=1e-6)
    assert {f"s/fc1/{k}" for k in ("std", "norm", "zero_frac", "nan")} <= set(acc.Tags()["scalars"])
    hists = acc.Histograms("r/fc1")
    assert [h.step for h in hists] == [0, 1] and hists[0].histogram_value.num == 32


def test_tensorboard_missing_is_a_config_error_with_the_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    with pytest.raises(hg.ConfigError) as err:
        run(mlp_cfg({"r": {"target": "fc1", "action": "record"}}, sink={"tensorboard": True}), tmp_path)
    assert err.value.key == "sink.tensorboard"
    assert "pip install hookgraph[tensorboard]" in str(err.value)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "model" not in summary  # said with the settings, before the model was built


def test_record_under_inference_mode_copies_what_has_no_version_counter():
    # Lightning's validate/test run under torch.inference_mode, where tensors keep no version
    # counter: the first call of a slot used to fail ("Inference tensors do not track version
    # counter"); now such entries are copies, equal to the output before the in-place ReLU.
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(2, 3), nn.ReLU(inplace=True))
    graph = hg.compile(m, {"a": {"target": "0", "action": "record"}})
    x = torch.tensor([[1.0, -2.0]])
    with graph.attach():
        with torch.inference_mode():
            m(x)
            m(x)
        m(x)
        with torch.inference_mode():
            m(x)
    want = m[0](x)
    assert (want < 0).any()  # the in-place ReLU would have changed an uncopied entry
    entries = graph.records["a"]["0"]
    assert [e.is_inference() for e in entries] == [True, True, False, True]
    assert all(torch.equal(e, want) for e in entries)
