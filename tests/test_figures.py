"""Pictures: Grad-CAM (the pure function and the overlay a run writes) and the resnet34
feature-map grids, through the packaged experiment configs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision
from matplotlib.image import imread

import hookgraph as hg
from hookgraph.report.figures import gradcam
from hookgraph.runner import run
from tests.reference import resnet34_conv_names
from tests.runs import compose


def _not_blank(path) -> bool:
    return path.is_file() and float(imread(str(path)).var()) > 0


def test_gradcam_matches_a_direct_computation_with_plain_hooks():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    seen: dict = {}

    def forward_hook(module, args, output):
        seen["act"] = output.detach().clone()
        output.register_hook(lambda g: seen.__setitem__("grad", g.detach().clone()))

    graph = hg.compile(model, {
        "activations": {"target": "layer4", "at": "forward", "action": "record"},
        "gradients": {"target": "layer4", "at": "output_grad", "action": "record"},
    })
    handle = model.layer4.register_forward_hook(forward_hook)
    try:
        with graph.attach():
            model(x)[0, 3].backward()  # the score of class 3
    finally:
        handle.remove()

    # Grad-CAM by hand: channel weights = spatial mean of the gradient; ReLU of the
    # weighted sum; bilinear upsampling to the input; min-max scaled to [0, 1].
    weights = seen["grad"].mean(dim=(2, 3), keepdim=True)
    cam = torch.relu((weights * seen["act"]).sum(dim=1, keepdim=True))
    cam = F.interpolate(cam, size=(64, 64), mode="bilinear", align_corners=False)[0, 0]
    direct = (cam - cam.min()) / (cam.max() - cam.min())

    got = gradcam(graph.records["activations"]["layer4"][0], graph.records["gradients"]["layer4"][0], (64, 64))
    assert got.shape == (64, 64)
    torch.testing.assert_close(got, direct, atol=1e-5, rtol=0)
    assert got.min().item() == 0.0 and got.max().item() == pytest.approx(1.0)
    assert torch.equal(gradcam(seen["act"][0], seen["grad"][0], 64), got)  # [C, h, w] and an int size


def test_gradcam_of_a_flat_map_is_zeros_and_shapes_must_agree():
    act = torch.ones(2, 3, 3)
    grad = -torch.ones(2, 3, 3)  # every weighted sum negative: ReLU leaves nothing
    assert torch.equal(gradcam(act, grad, (6, 5)), torch.zeros(6, 5))
    with pytest.raises(hg.HookGraphError, match=r"\[2, 3, 3\] and \[2, 3, 4\]"):
        gradcam(act, torch.ones(2, 3, 4), 8)


def test_gradcam_experiment_writes_a_non_blank_overlay(tmp_path):
    cfg = compose(
        "+experiment=gradcam",
        "data.shape=[3,64,64]",
        "runner.device=cpu",
        "sink.histograms=false",
        "sink.feature_maps=[]",
    )
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    assert summary["figures"] == ["figures/gradcam_layer4.png"]
    png = tmp_path / "figures" / "gradcam_layer4.png"
    assert _not_blank(png)
    # The overlay is drawn from what the run recorded (the input itself is not a record).
    back = hg.load_run(tmp_path)
    assert sorted(back.records) == ["activations", "gradients"]
    heat = gradcam(back.records["activations"]["layer4"][0], back.records["gradients"]["layer4"][0], (64, 64))
    assert heat.max().item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("override", "key", "hint"),
    [
        ("sink.gradcam.target=layer3", "sink.gradcam.target", "'layer4'"),
        ("sink.gradcam.activations=activation", "sink.gradcam.activations", "'activations'"),
        ("sink.gradcam.gradients=activations", "sink.gradcam.gradients", "output_grad"),
        ("runner.backward=false", "runner.backward", "runner.backward=true"),
    ],
)
def test_gradcam_config_errors_name_the_key_before_running(tmp_path, override, key, hint):
    cfg = compose("+experiment=gradcam", "data.shape=[3,64,64]", "runner.device=cpu", override)
    with pytest.raises(hg.ConfigError) as err:
        run(cfg, tmp_path)
    assert err.value.key == key and hint in str(err.value)
    assert not (tmp_path / "records").exists()  # refused before the first pass


def test_resnet34_feature_maps_experiment(tmp_path):
    cfg = compose("+experiment=resnet34_feature_maps", "data.shape=[3,64,64]", "runner.device=cpu")
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    for index in (0, 15, 30):
        (png,) = (tmp_path / "figures").glob(f"fmap_record_convs_{index:02d}_*.png")
        assert _not_blank(png), png
    assert len(list((tmp_path / "figures").glob("*.png"))) == 3  # histograms are off in this experiment
    targets = hg.load_run(tmp_path).records["record_convs"]
    assert sorted(targets) == sorted(resnet34_conv_names())


def test_histograms_and_stats_over_steps(tmp_path):
    cfg = {
        "model": {"name": "mlp"},
        "runner": {"steps": 3, "progress": False},
        "hooks": {
            "acts": {"target": "*", "types": ["Linear"], "action": "record"},
            "grads": {"target": "*", "types": ["Linear"], "at": "output_grad", "action": "stats"},
        },
    }
    summary = run(cfg, tmp_path)
    assert sorted(summary["figures"]) == ["figures/hist_acts.png", "figures/stats_over_steps.png"]
    assert all(_not_blank(tmp_path / f) for f in summary["figures"])


def test_sweep_figure(tmp_path):
    from hookgraph.report.figures import sweep_figure

    rows = [
        {"job": 0, "overrides": "a=1", "loss": 1.0},
        {"job": 1, "overrides": "a=2", "loss": 3.0},
        {"job": 2, "status": "failed"},
    ]
    assert _not_blank(sweep_figure(rows, tmp_path / "sweep.png"))
    assert sweep_figure([{"job": 0, "status": "failed"}], tmp_path / "none.png") is None
