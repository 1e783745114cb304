"""Tests for hookgraph.data.build_data: random, none, fake and image-folder batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from hookgraph.data import IMAGENET_MEAN, IMAGENET_STD, Batches, build_data
from hookgraph.errors import ConfigError


def _png(path: Path, size: tuple[int, int] = (6, 4), color: tuple[int, int, int] = (255, 0, 0)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


# ---------------------------------------------------------------- random / none


def test_random_shapes_and_labels() -> None:
    data = build_data("random", shape=(3, 5, 5), num_classes=4, batch_size=6)
    assert isinstance(data, Batches)
    (x,), y = next(iter(data))
    assert x.shape == (6, 3, 5, 5) and x.dtype == torch.float32
    assert y.shape == (6,) and y.dtype == torch.long
    assert int(y.min()) >= 0 and int(y.max()) < 4


def test_random_is_deterministic_per_seed_and_restarts() -> None:
    a = build_data("random", shape=[4], batch_size=2, seed=1).take(3)
    b = build_data("random", shape=[4], batch_size=2, seed=1).take(3)
    c = build_data("random", shape=[4], batch_size=2, seed=2).take(3)
    assert all(torch.equal(p[0][0], q[0][0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0][0][0], c[0][0][0])
    assert not torch.equal(a[0][0][0], a[1][0][0])  # steps differ within one stream
    data = build_data("random", shape=4, seed=1)
    assert torch.equal(next(iter(data))[0][0], next(iter(data))[0][0])  # every iter() restarts


def test_random_does_not_touch_global_rng() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_data("random", shape=(2,)).take(2)
    assert torch.equal(torch.rand(3), expected)


def test_none_gives_empty_inputs_forever() -> None:
    batches = build_data("none").take(3)
    assert batches == [((), None)] * 3


def test_random_accepts_omegaconf_shape() -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"shape": [2, 3]})
    (x,), _ = next(iter(build_data("random", shape=cfg.shape)))
    assert x.shape == (1, 2, 3)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"kind": "randon"}, "data.kind"),
        ({"shape": [3, 0]}, "data.shape"),
        ({"shape": "3x4"}, "data.shape"),
        ({"batch_size": 0}, "data.batch_size"),
        ({"num_classes": -1}, "data.num_classes"),
    ],
)
def test_bad_settings(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_data(**kwargs)
    assert info.value.key == key


def test_unknown_kind_suggests() -> None:
    with pytest.raises(ConfigError) as info:
        build_data("imgs", key="run.data")
    assert info.value.key == "run.data.kind"
    assert "'images'" in str(info.value)


# ---------------------------------------------------------------- fake


def test_fake_batch_shape_and_cycle() -> None:
    data = build_data("fake", shape=(3, 8, 8), size=4, num_classes=3, batch_size=2)
    assert data.epoch_length == 2
    batches = data.take(3)
    (x,), y = batches[0]
    assert x.shape == (2, 3, 8, 8) and type(x) is torch.Tensor
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert y.shape == (2,) and int(y.max()) < 3
    assert torch.equal(batches[2][0][0], x)  # the third batch starts the second epoch


def test_fake_resize_and_normalize() -> None:
    raw = build_data("fake", shape=(3, 8, 8), size=2)
    norm = build_data("fake", shape=(3, 8, 8), size=2, normalize=True, image_size=4)
    (x,), _ = next(iter(raw))
    (z,), _ = next(iter(norm))
    assert z.shape == (1, 3, 4, 4)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    custom = build_data("fake", shape=(3, 8, 8), size=2, normalize={"mean": IMAGENET_MEAN, "std": IMAGENET_STD})
    (w,), _ = next(iter(custom))
    assert torch.allclose(w, (x - mean) / std, atol=1e-6)


def test_fake_bad_normalize() -> None:
    with pytest.raises(ConfigError) as info:
        build_data("fake", normalize={"mean": [0.5]})
    assert info.value.key == "data.normalize"


# ---------------------------------------------------------------- images


def test_image_folder_gives_labels(tmp_path: Path) -> None:
    for cls, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
        for i in range(2):
            _png(tmp_path / cls / f"{i}.png", color=color)
    data = build_data("images", root=str(tmp_path), batch_size=4)
    (x,), y = next(iter(data))
    assert x.shape == (4, 3, 4, 6)
    assert y.tolist() == [0, 0, 1, 1]
    assert torch.allclose(x[0, 0], torch.ones(4, 6)) and torch.allclose(x[3, 2], torch.ones(4, 6))


def test_flat_folder_gives_no_labels(tmp_path: Path) -> None:
    for i in range(3):
        _png(tmp_path / f"img{i}.PNG")
    (tmp_path / "notes.txt").write_text("not an image")
    data = build_data("images", root=tmp_path, image_size=[5, 7], batch_size=3)
    (x,), y = next(iter(data))
    assert x.shape == (3, 3, 5, 7)
    assert y is None


def test_images_normalize_true_uses_imagenet(tmp_path: Path) -> None:
    _png(tmp_path / "a.png", color=(0, 0, 0))
    (x,), _ = next(iter(build_data("images", root=tmp_path, normalize=True)))
    expected = -torch.tensor(IMAGENET_MEAN) / torch.tensor(IMAGENET_STD)
    assert torch.allclose(x[0, :, 0, 0], expected, atol=1e-6)


def test_images_of_different_sizes_need_image_size(tmp_path: Path) -> None:
    _png(tmp_path / "a.png", size=(4, 4))
    _png(tmp_path / "b.png", size=(5, 3))
    with pytest.raises(ConfigError) as info:
        next(iter(build_data("images", root=tmp_path, batch_size=2)))
    assert info.value.key == "data.image_size"
    (x,), _ = next(iter(build_data("images", root=tmp_path, batch_size=2, image_size=4)))
    assert x.shape == (2, 3, 4, 4)


def test_images_missing_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        build_data("images", root=tmp_path / "nope")
    assert info.value.key == "data.root"
    with pytest.raises(ConfigError) as info:
        build_data("images")
    assert info.value.key == "data.root"


def test_images_empty_folder_names_extensions(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(ConfigError) as info:
        build_data("images", root=tmp_path, key="probe.data")
    assert info.value.key == "probe.data.root"
    assert ".png" in str(info.value) and ".jpg" in str(info.value)


# ---------------------------------------------------------------- the registry


def test_a_key_no_kind_has_names_the_kinds_keys_nearest_first() -> None:
    with pytest.raises(ConfigError) as info:
        build_data("random", shap=[3])
    assert info.value.key == "data.shap"
    assert "unknown key for data kind 'random'; its keys, nearest first: shape, num_classes, seed" in str(info.value)
    with pytest.raises(ConfigError, match="data kind 'none' takes no keys") as info:
        build_data("none", colour=1)
    assert info.value.key == "data.colour"


def test_keys_of_other_kinds_are_ignored() -> None:
    # One data section serves every kind: tokens does not use shape or size.
    (batch,) = build_data("tokens", vocab_size=7, seq_len=3, shape=[9], size=2).take(1)
    assert batch[0]["input_ids"].shape == (1, 3) and int(batch[0]["input_ids"].max()) < 7


def test_a_new_kind_is_a_config_and_a_builder() -> None:
    from dataclasses import dataclass

    from hookgraph.data import DATA_KINDS, Batches, DataContext, register_data

    @dataclass(frozen=True, kw_only=True)
    class Ramp:
        length: int = 2  # values per sample

    @register_data("ramp_test", Ramp)
    def ramp(cfg: Ramp, ctx: DataContext) -> Batches:
        x = torch.arange(float(cfg.length)).expand(ctx.batch_size, cfg.length)
        return Batches("ramp_test", lambda: iter([((x,), None)]), batch_size=ctx.batch_size, epoch_length=1)

    try:
        (x,), _ = build_data("ramp_test", length=3, batch_size=2).take(1)[0]
        assert x.tolist() == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]
        # Generated data is cut per rank: rank 1 of 2 keeps the second half of the global batch.
        (part,), _ = build_data("ramp_test", batch_size=1, rank=1, world_size=2).take(1)[0]
        assert part.tolist() == [[0.0, 1.0]]
        with pytest.raises(ConfigError, match="its keys, nearest first: length"):
            build_data("ramp_test", lenght=3)
    finally:
        del DATA_KINDS["ramp_test"]


def test_a_kind_config_must_be_a_frozen_dataclass_with_defaults() -> None:
    from dataclasses import dataclass

    from hookgraph.data import register_data

    @dataclass
    class Loose:
        n: int = 1

    @dataclass(frozen=True, kw_only=True)
    class NoDefault:
        n: int

    with pytest.raises(TypeError, match="frozen dataclass"):
        register_data("loose_test", Loose)
    with pytest.raises(TypeError, match=r"\['n'\] have none"):
        register_data("no_default_test", NoDefault)


def test_every_kind_key_is_in_the_schema_the_command_line_is_checked_against() -> None:
    from dataclasses import fields

    from hookgraph.config.schema import DataConfig
    from hookgraph.data import DATA_KINDS

    schema = {("target" if f.name == "_target_" else f.name) for f in fields(DataConfig)}
    for name, entry in DATA_KINDS.items():
        assert set(entry.keys) <= schema, (name, set(entry.keys) - schema)
    assert {"none", "random", "fake", "images", "custom", "torchvision", "tokens", "text", "auto"} <= set(DATA_KINDS)


def test_auto_feeds_the_model_its_own_default() -> None:
    from hookgraph.models import build_model

    model = build_model("tiny_linear")
    (x,), _ = build_data("auto", model=model, shape=[5]).take(1)[0]
    assert x.shape == (1, *model.default_data["shape"])  # the model's shape wins over data.shape
    (y,), _ = build_data("auto", shape=[5]).take(1)[0]  # no model: random tensors of shape
    assert y.shape == (1, 5)
