"""model.weights loads torchvision's named weights from the torch hub cache with
weights_only=True and never downloads (issue 15, security)."""

from __future__ import annotations

import pickle

import pytest
import torch
import torchvision

import hookgraph as hg
from hookgraph.models import build_model
from hookgraph.models.build import hub_checkpoint_path
from tests.payloads import Payload


def resnet18_file():
    path = hub_checkpoint_path(torchvision.models.ResNet18_Weights.DEFAULT.url)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_planted_pickle_in_the_hub_cache_is_refused_not_run(torch_home, tmp_path):
    marker = tmp_path / "payload-ran"
    path = resnet18_file()
    assert str(path) == str(torch_home / "hub" / "checkpoints" / "resnet18-f37072fd.pth")
    path.write_bytes(pickle.dumps(Payload(str(marker))))
    with pytest.raises(hg.ConfigError) as err:
        build_model("resnet18", weights="DEFAULT")
    assert not marker.exists()
    assert err.value.key == "model.weights"
    assert "refused to load" in str(err.value) and "weights_only=True" in str(err.value)


def test_missing_weights_say_where_to_put_them_and_nothing_is_downloaded(torch_home, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("hookgraph tried to download")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    with pytest.raises(hg.ConfigError) as err:
        build_model("resnet18", weights="IMAGENET1K_V1")
    msg = str(err.value)
    assert err.value.key == "model.weights"
    assert "https://download.pytorch.org/models/resnet18-f37072fd.pth" in msg
    assert str(torch_home / "hub" / "checkpoints" / "resnet18-f37072fd.pth") in msg


def test_a_real_state_dict_in_the_cache_loads(torch_home):
    state = torchvision.models.resnet18().state_dict()
    state["fc.bias"] = torch.arange(1000, dtype=torch.float32)
    torch.save(state, resnet18_file())
    model = build_model("resnet18", weights="ResNet18_Weights.DEFAULT")
    assert torch.equal(model.fc.bias.detach(), torch.arange(1000, dtype=torch.float32))
    # The torchvision method was swapped only while the builder ran.
    from torchvision.models._api import WeightsEnum

    assert WeightsEnum.get_state_dict.__module__ == "torchvision.models._api"


def test_a_cached_file_of_the_wrong_model_is_a_config_error(torch_home):
    torch.save({"weight": torch.zeros(2)}, resnet18_file())
    with pytest.raises(hg.ConfigError, match="model.weights: the cached file for 'DEFAULT' does not fit 'resnet18'"):
        build_model("resnet18", weights="DEFAULT")
