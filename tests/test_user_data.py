"""The user's own data: custom Datasets, torchvision datasets from local files, token ids, text;
batches of any structure on the device; losses on Hugging Face outputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hookgraph as hg
from hookgraph.data import as_batch, build_data
from hookgraph.errors import ConfigError
from hookgraph.runner import run
from hookgraph.runner.batches import compute_loss, first_tensor, to_device
from tests.user_helpers import GPT2_SMALL, LINES, DictTokens, Pairs, train_tokenizer, write_mnist


def test_items_follow_torchvision_and_hugging_face_conventions():
    x, y = torch.ones(2, 3), torch.tensor([1, 2])
    assert as_batch(x, "k")[0][0] is x and as_batch(x, "k")[1] is None
    inputs, labels = as_batch([x, y], "k")
    assert inputs[0] is x and labels is y
    inputs, labels = as_batch({"input_ids": y}, "k")
    assert inputs == {"input_ids": y} and labels is None
    with pytest.raises(ConfigError) as info:
        as_batch([x, y, y], "data._target_")
    assert info.value.key == "data._target_" and "3-tuple" in str(info.value)


def test_custom_map_style_pairs_batched_in_order():
    data = build_data("custom", target="tests.user_helpers.Pairs", kwargs={"n": 6}, batch_size=4)
    (x,), y = next(iter(data))
    ref = Pairs(6)
    assert torch.equal(x, ref.x[:4]) and torch.equal(y, ref.y[:4])
    assert data.epoch_length == 1  # the short last batch is dropped


def test_custom_factory_with_shuffle_is_seeded():
    a = build_data(
        "custom", target="tests.user_helpers.make_pairs", kwargs={"n": 6}, batch_size=6, shuffle=True, seed=3
    )
    b = build_data(
        "custom", target="tests.user_helpers.make_pairs", kwargs={"n": 6}, batch_size=6, shuffle=True, seed=3
    )
    (xa,), ya = next(iter(a))
    (xb,), _ = next(iter(b))
    mine = torch.utils.data.DataLoader(Pairs(6), batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(3))
    x, y = next(iter(mine))
    assert torch.equal(xa, xb) and torch.equal(xa, x) and torch.equal(ya, y)
    assert not torch.equal(xa, Pairs(6).x)


def test_custom_iterable_dataset_and_dict_items():
    stream = build_data("custom", target="tests.user_helpers.Stream", kwargs={"n": 5}, batch_size=2)
    batches = stream.take(3)
    assert [b[0][0][:, 0].tolist() for b in batches] == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    with pytest.raises(ConfigError) as info:
        build_data("custom", target="tests.user_helpers.Stream", batch_size=2, shuffle=True)
    assert info.value.key == "data.shuffle"
    inputs, labels = next(
        iter(build_data("custom", target="tests.user_helpers.DictTokens", kwargs={"labels": True}, batch_size=3))
    )
    assert sorted(inputs) == ["input_ids", "labels"] and torch.equal(
        inputs["input_ids"], DictTokens(labels=True).ids[:3]
    )


def test_custom_errors_name_the_key():
    with pytest.raises(ConfigError) as info:
        build_data("custom", target="tests.user_helpers.NoSuchSet")
    assert info.value.key == "data._target_" and "NoSuchSet" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build_data("custom", target="tests.user_helpers.Pairs", kwargs={"m": 1})
    assert info.value.key == "data._target_" and "unexpected keyword argument 'm'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build_data("custom")
    assert info.value.key == "data._target_"


def test_torchvision_mnist_from_local_idx_files(tmp_path):
    images, labels = write_mnist(tmp_path)
    data = build_data("torchvision", name="MNIST", root=str(tmp_path), batch_size=4)
    (x,), y = next(iter(data))
    assert x.shape == (4, 1, 28, 28) and x.dtype == torch.float32
    assert torch.allclose(x[:, 0], images[:4].float() / 255) and torch.equal(y, labels[:4])
    (x,), y = next(
        iter(build_data("torchvision", name="MNIST", root=str(tmp_path), kwargs={"train": False}, batch_size=4))
    )
    assert y.tolist() == [0, 1, 2, 3] and not torch.allclose(x[:, 0], images[:4].float() / 255)


def test_torchvision_errors_say_what_is_expected(tmp_path):
    with pytest.raises(ConfigError) as info:
        build_data("torchvision", name="MNIST", root=str(tmp_path / "nope"))
    assert info.value.key == "data.root" and "MNIST/raw/train-images-idx3-ubyte" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build_data("torchvision", name="MNIST", root=str(tmp_path))  # exists, but empty
    assert info.value.key == "data.root" and "downloads are off" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build_data("torchvision", name="MINST", root=str(tmp_path))
    assert info.value.key == "data.name" and "MNIST" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build_data("torchvision", name="MNIST", root=str(tmp_path), kwargs={"download": True})
    assert info.value.key == "data.kwargs.download"


def test_tokens_are_seeded_input_ids():
    data = build_data("tokens", vocab_size=50, seq_len=7, batch_size=3, seed=4)
    first, second = data.take(2)
    gen = torch.Generator().manual_seed(4)
    assert torch.equal(first[0]["input_ids"], torch.randint(0, 50, (3, 7), generator=gen))
    assert torch.equal(second[0]["input_ids"], torch.randint(0, 50, (3, 7), generator=gen))
    assert first[1] is None
    with pytest.raises(ConfigError) as info:
        build_data("tokens")
    assert info.value.key == "data.vocab_size"


def test_text_lines_through_a_local_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    folder = train_tokenizer(tmp_path / "tok")
    (tmp_path / "lines.txt").write_text("\n".join(LINES[:2]) + "\n\n" + "\n".join(LINES[2:]) + "\n")
    data = build_data("text", path=str(tmp_path / "lines.txt"), tokenizer=str(folder), seq_len=6, batch_size=2)
    assert data.epoch_length == 2
    (a, _), (b, _) = data.take(2)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ref = tok(LINES[2:], padding=True, truncation=True, max_length=6, return_tensors="pt")
    assert torch.equal(b["input_ids"], ref["input_ids"]) and torch.equal(b["attention_mask"], ref["attention_mask"])
    assert a["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]  # "a dog ran" is padded
    with pytest.raises(ConfigError) as info:
        build_data("text", path=str(tmp_path / "lines.txt"), tokenizer=str(tmp_path / "none"))
    assert info.value.key == "data.tokenizer" and "nothing is downloaded" in str(info.value)


def test_nested_batches_move_and_cast_whatever_their_structure():
    batch = (
        {"input_ids": torch.ones(2, 3, dtype=torch.long), "extra": [torch.zeros(2), (torch.ones(1),)]},
        torch.tensor([1, 0]),
    )
    moved = to_device(batch, torch.device("meta"), torch.float64)
    assert moved[0]["input_ids"].device.type == "meta" and moved[0]["input_ids"].dtype == torch.long
    assert moved[0]["extra"][0].dtype == torch.float64 and moved[0]["extra"][1][0].device.type == "meta"
    assert moved[1].device.type == "meta" and moved[1].dtype == torch.long


@pytest.fixture(scope="module")
def gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_SMALL)).eval()


def test_losses_on_a_model_output(gpt2):
    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        out = gpt2(input_ids=ids, attention_mask=mask)
        labelled = gpt2(input_ids=ids, labels=ids)
    assert first_tensor(labelled) is labelled.logits  # sum/mean use the logits, not .loss
    assert torch.equal(compute_loss(out, None, {"input_ids": ids}, "sum"), out.logits.sum())
    assert torch.equal(compute_loss(labelled, None, {}, "model"), labelled.loss)
    lm = compute_loss(labelled, None, {"input_ids": ids}, "lm")
    assert torch.allclose(lm, labelled.loss)  # Hugging Face's own shifted loss
    masked = compute_loss(out, None, {"input_ids": ids, "attention_mask": mask}, "lm")
    targets = ids[:, 1:].clone()
    targets[1, 3:] = -100
    assert torch.allclose(
        masked, F.cross_entropy(out.logits[:, :-1].reshape(-1, 100), targets.reshape(-1), ignore_index=-100)
    )
    with pytest.raises(ConfigError) as info:
        compute_loss(out, None, {}, "model")
    assert info.value.key == "runner.loss" and "labels" in str(info.value)


def test_a_run_with_a_dict_dataset_and_the_models_own_loss(tmp_path, gpt2):
    cfg = {
        "model": {
            "name": None,
            "_target_": "transformers.GPT2LMHeadModel",
            "kwargs": {"config": {"_target_": "transformers.GPT2Config", **GPT2_SMALL}},
        },
        "data": {"kind": "custom", "_target_": "tests.user_helpers.DictTokens", "kwargs": {"labels": True}},
        "runner": {"progress": False, "batch_size": 4, "loss": "model", "steps": 2},
        "sink": {"figures": False},
        "hooks": {"mlp": {"target": "transformer.h.1.mlp", "action": "record"}},
    }
    summary = run(cfg, tmp_path)
    ds = DictTokens(labels=True)
    mine = []
    handle = gpt2.transformer.h[1].mlp.register_forward_hook(lambda m, a, out: mine.append(out.detach()))
    try:
        losses = [float(gpt2(input_ids=ds.ids[i : i + 4], labels=ds.ids[i : i + 4]).loss.detach()) for i in (0, 4)]
    finally:
        handle.remove()
    assert summary["losses"] == pytest.approx(losses, rel=1e-6)
    recs = hg.load_run(tmp_path).records["mlp"]["transformer.h.1.mlp"]
    assert len(recs) == 2 and all(torch.allclose(r, m, atol=1e-6) for r, m in zip(recs, mine, strict=True))


def test_data_auto_feeds_a_language_model_token_ids(tmp_path, gpt2):
    cfg = {
        "model": {
            "name": None,
            "_target_": "transformers.GPT2LMHeadModel",
            "kwargs": {"config": {"_target_": "transformers.GPT2Config", **GPT2_SMALL}},
        },
        "runner": {"progress": False, "backward": False},
        "sink": {"figures": False},
        "hooks": {"emb": {"target": "transformer.wte", "at": "forward_pre", "action": "record", "index": 0}},
    }
    run(cfg, tmp_path)
    (ids,) = hg.load_run(tmp_path).records["emb"]["transformer.wte"]
    assert torch.equal(ids, torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(0)))


def test_custom_with_worker_processes_gives_the_same_batches():
    one = build_data("custom", target="tests.user_helpers.Pairs", batch_size=2).take(3)
    two = build_data("custom", target="tests.user_helpers.Pairs", batch_size=2, num_workers=2).take(3)
    assert all(torch.equal(a[0][0], b[0][0]) and torch.equal(a[1], b[1]) for a, b in zip(one, two, strict=True))
    with pytest.raises(ConfigError) as info:
        build_data("custom", target="tests.user_helpers.Pairs", num_workers=-1)
    assert info.value.key == "data.num_workers"


def test_cross_entropy_labels_out_of_the_models_range_name_data_num_classes(tmp_path):
    from hookgraph.errors import ConfigError
    from hookgraph.runner import run

    cfg = {"model": {"name": "tiny_linear"}, "data": {"kind": "random", "shape": [1], "num_classes": 50},
           "runner": {"device": "cpu", "progress": False, "loss": "cross_entropy"}, "sink": {"figures": False},
           "hooks": {}}
    expected = r"data\.num_classes: labels must be class indices in \[0, 2\).*data\.num_classes=2"
    with pytest.raises(ConfigError, match=expected):
        run(cfg, tmp_path)
