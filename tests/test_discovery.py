"""Discovery: list_targets rows and the format_targets table."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

import hookgraph as hg
from tests.reference import conv_names


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return self.conv2(self.bn1(self.conv1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.layer1 = nn.Sequential(Block())
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.layer1(self.conv(x)).mean((2, 3)))


def test_module_rows_for_a_glob():
    rows = hg.list_targets(Net(), "**.conv*")
    assert rows == [
        {"name": "conv", "type": "Conv2d", "params": 3 * 4 * 9 + 4, "shapes": {"weight": [4, 3, 3, 3], "bias": [4]}},
        {"name": "layer1.0.conv1", "type": "Conv2d", "params": 4 * 4 * 9, "shapes": {"weight": [4, 4, 3, 3]}},
        {
            "name": "layer1.0.conv2",
            "type": "Conv2d",
            "params": 4 * 4 + 4,
            "shapes": {"weight": [4, 4, 1, 1], "bias": [4]},
        },
    ]


def test_default_listing_includes_the_root_and_containers():
    model = Net()
    rows = hg.list_targets(model)
    assert [r["name"] for r in rows] == [n for n, _ in model.named_modules()]
    root = rows[0]
    assert (root["name"], root["type"], root["shapes"]) == ("", "Net", {})
    assert root["params"] == sum(p.numel() for p in model.parameters())
    block = next(r for r in rows if r["name"] == "layer1.0")
    assert block["type"] == "Block" and block["shapes"] == {}  # container: no own parameters
    assert block["params"] == 4 * 4 * 9 + 8 + 4 * 4 + 4


def test_root_only_with_empty_pattern():
    assert [r["name"] for r in hg.list_targets(Net(), "")] == [""]


def test_regex_pattern_and_no_match():
    assert [r["name"] for r in hg.list_targets(Net(), r"re:layer1\.0\.(bn|conv)1")] == [
        "layer1.0.conv1",
        "layer1.0.bn1",
    ]
    assert hg.list_targets(Net(), "nothing*") == []


def test_parameter_rows():
    model = Net().half()
    model.fc.bias.requires_grad_(False)
    rows = hg.list_targets(model, "**", params=True)
    assert [r["name"] for r in rows] == [n for n, _ in model.named_parameters()]
    fc_bias = rows[-1]
    assert fc_bias == {"name": "fc.bias", "type": "Linear", "shape": [2], "dtype": "float16", "requires_grad": False}
    bn_weight = next(r for r in rows if r["name"] == "layer1.0.bn1.weight")
    assert (bn_weight["type"], bn_weight["shape"], bn_weight["requires_grad"]) == ("BatchNorm2d", [4], True)


def test_parameter_rows_for_a_glob():
    rows = hg.list_targets(Net(), "**.bias", params=True)
    assert [r["name"] for r in rows] == ["conv.bias", "layer1.0.bn1.bias", "layer1.0.conv2.bias", "fc.bias"]


def test_listed_names_are_the_names_specs_resolve():
    model = Net()
    listed = [r["name"] for r in hg.list_targets(model, "**.conv*")]
    graph = hg.compile(model, {"convs": {"target": "**.conv*", "action": "record"}})
    assert [r["target"] for r in graph.plan()] == listed
    listed_params = [r["name"] for r in hg.list_targets(model, "**.weight", params=True)]
    graph = hg.compile(model, {"w": {"target": "**.weight", "at": "param_grad", "action": "record"}})
    assert [r["target"] for r in graph.plan()] == listed_params


def test_format_targets_has_a_header_and_a_row_per_name():
    rows = hg.list_targets(Net())
    text = hg.format_targets(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["name", "type", "params", "shapes"]
    assert len(lines) == len(rows) + 1
    assert lines[1].split()[:3] == ["(root)", "Net", str(rows[0]["params"])]
    assert lines[2].startswith("conv ") and "Conv2d" in lines[2] and "{'weight': [4, 3, 3, 3], 'bias': [4]}" in lines[2]
    # Columns line up: every row's type starts where the header's does.
    col = lines[0].index("type")
    assert all(line[col - 2 : col] == "  " and line[col] != " " for line in lines[1:])


def test_format_parameter_rows_header():
    text = hg.format_targets(hg.list_targets(Net(), "fc.*", params=True))
    lines = text.splitlines()
    assert lines[0].split() == ["name", "type", "shape", "dtype", "requires_grad"]
    assert lines[1].split() == ["fc.weight", "Linear", "[2,", "4]", "float32", "True"]


def test_format_no_rows():
    assert hg.format_targets([]) == "(no names match)"


def test_resnet18_conv_listing():
    model = torchvision.models.resnet18(weights=None)
    rows = hg.list_targets(model, "**.conv*")
    names = [r["name"] for r in rows]
    assert len(rows) == 17  # conv1 + two per basic block; downsample.0 is not named conv*
    assert names[:3] == ["conv1", "layer1.0.conv1", "layer1.0.conv2"]
    assert all(r["type"] == "Conv2d" for r in rows)
    assert rows[0]["shapes"] == {"weight": [64, 3, 7, 7]}
    all_convs = hg.list_targets(model, "**")
    assert [r["name"] for r in all_convs if r["type"] == "Conv2d"] == conv_names(model)
    assert len(hg.list_targets(model, "**", params=True)) == len(list(model.parameters()))
    # Discovery does not touch hooks or modes.
    assert model.training and not any(m._forward_hooks for m in model.modules())
    with torch.no_grad():
        assert model.conv1(torch.zeros(1, 3, 32, 32)).shape == (1, 64, 16, 16)


def test_list_targets_with_a_bad_regex():
    with pytest.raises(hg.ConfigError, match=r"list_targets: invalid regular expression 're:\['"):
        hg.list_targets(nn.Linear(2, 2), "re:[")
