"""The messages a newcomer meets first say what hookgraph knows (issue 37, frictions 5 and 6),
checked in-process: the command line's own checks, before Hydra runs."""

from __future__ import annotations

import sys

import pytest

import hookgraph as hg
import hookgraph.__main__ as entry
from hookgraph.cli.app import _unknown_hook_set


@pytest.mark.parametrize("arg", ["hooks=[record_conv]", "hooks=record_conv", "+hooks=record_conv",
                                 "hooks=[nan_watch,record_conv]"])
def test_an_unknown_hook_set_names_the_nearest_and_lists_them(arg):
    message = _unknown_hook_set([arg])
    assert message is not None and message.startswith("hooks: no hook set 'record_conv'; did you mean 'record_convs'")
    assert "nan_watch" in message and "grad_stats" in message  # every option, as Hydra lists a model's


def test_known_sets_and_what_only_hydra_can_judge_pass(tmp_path):
    assert _unknown_hook_set(["hooks=[record_convs,nan_watch]", "hooks=[]", "+hooks=nan_watch"]) is None
    assert _unknown_hook_set(["hooks=[mylib/probe]", "+hooks.x={target: a}", "hooks=${x}"]) is None
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "mine.yaml").write_text("m: {target: fc1}\n")
    assert _unknown_hook_set(["--config-dir", str(tmp_path), "hooks=[mine]"]) is None
    assert _unknown_hook_set(["hooks=[mine]"]) is not None


def test_a_bare_word_is_an_unknown_command_not_missing_equal(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["hookgraph", "lis"])
    with pytest.raises(SystemExit) as exit_:
        entry.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "hookgraph: error: unknown command 'lis'; did you mean 'list'?" in err and "EQUAL" not in err


def test_an_exclude_that_drops_every_match_says_so_not_matched_nothing():
    """'fc*' matched fc1 and fc2; exclude 'fc*' dropped both: the message said "'fc*' matched
    nothing; nearest names: fc1" (issue 37, friction 6)."""
    from torch import nn

    import hookgraph as hg

    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(2, 2))
    model.add_module("fc2", nn.Linear(2, 2))
    with pytest.raises(hg.SpecError) as err:
        hg.compile(model, {"s": {"target": "fc*", "exclude": "fc*", "action": "record"}})
    text = str(err.value)
    assert "hooks.s.exclude: 'fc*' matched 2 names, all dropped by exclude 'fc*'" in text
    assert "matched nothing" not in text


def test_a_tokenizer_file_is_told_to_give_its_folder(tmp_path):
    from hookgraph.data.kinds.text import load_tokenizer
    from hookgraph.errors import ConfigError

    file = tmp_path / "tokenizer.json"
    file.write_text("{}")
    with pytest.raises(ConfigError, match=r"data.tokenizer: '.*tokenizer.json' is a file; give the folder it is in"):
        load_tokenizer(str(file), "data")
    with pytest.raises(ConfigError, match="no such folder"):
        load_tokenizer(str(tmp_path / "missing"), "data")


def _tutorial(name, tmp_path):
    from hookgraph.runner import closing_lines, run
    from tests.runs import CPU, compose

    run(compose(f"+experiment={name}", *CPU, "sink.figures=false"), tmp_path / name)
    summary = __import__("json").loads((tmp_path / name / "summary.json").read_text())
    return summary["shown"], [text for _, text in closing_lines(summary)]


def test_the_tutorial_experiments_print_their_numbers(tmp_path):
    """intermediate_grads and grad_plus_two print the gradients the README quotes (0.2/0.4,
    39/21/3), equal to torch's own autograd on the same tensors (issue 37, friction 8)."""
    import torch

    a = torch.ones(5, requires_grad=True)
    b = 2 * a
    b.retain_grad()
    b.mean().backward()
    shown, lines = _tutorial("intermediate_grads", tmp_path)
    assert shown == {"b_grad": {"b": "[" + ", ".join(f"{v:.4g}" for v in b.grad.tolist()) + "]"},
                     "a_grad": {"a": "[" + ", ".join(f"{v:.4g}" for v in a.grad.tolist()) + "]"}}
    assert "b_grad at b: [0.2, 0.2, 0.2, 0.2, 0.2]" in lines and "a_grad at a: [0.4, 0.4, 0.4, 0.4, 0.4]" in lines

    x, y = torch.tensor(7.0, requires_grad=True), torch.tensor(13.0, requires_grad=True)
    c = x * y
    c.register_hook(lambda g: g + 2)  # the experiment's add 2, by hand
    c.retain_grad()
    c.backward()
    shown, lines = _tutorial("grad_plus_two", tmp_path)
    assert shown == {"c_grad": {"mul": f"{c.grad.item():.4g}"},
                     "ab_grads": {"a": f"{x.grad.item():.4g}", "b": f"{y.grad.item():.4g}"}}
    assert [t for t in lines if "_grad" in t] == ["c_grad at mul: 3", "ab_grads at a: 39", "ab_grads at b: 21"]


def test_sink_show_names_a_spec_of_the_run():
    from hookgraph.config.settings import settings_from
    from hookgraph.errors import ConfigError
    from hookgraph.runner.checks import _check_show
    from tests.runs import compose

    with pytest.raises(ConfigError, match=r"sink.show: 'a_grd' is not a spec of this run; did you mean 'a_grad'"):
        _check_show(settings_from(compose("+experiment=intermediate_grads", "sink.show=[a_grd]")))


def test_probe_on_items_without_tokens_suggests_a_token_table(tmp_path):
    """A record without tokens: true gives items token -1; the probe's default labels.source
    token said only "the labels give 0 class(es)" (issue 37, friction 3)."""
    import torch

    from hookgraph.errors import ConfigError
    from hookgraph.probe import train_probe
    from hookgraph.runs.writer import RunWriter

    w = RunWriter(tmp_path / "run", fsync="never")
    for s in range(3):
        w.flush_records({"resid": {"h.1": [torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(s))]}}, s)
    w.json("summary.json", {"status": "completed", "manifest": w.manifest()})
    with pytest.raises(ConfigError, match=r"labels.source: token: the items of spec 'resid' carry no token ids "
                                          r"\(token -1\): .*hooks.resid.args.tokens=true"):
        train_probe({"run": str(tmp_path / "run"), "spec": "resid", "epochs": 1,
                     "out": str(tmp_path / "p.safetensors")})


def test_a_plus_on_a_typed_field_says_to_drop_it():
    """+runner.generate.do_sample=true failed with Hydra's "already at": the field is the
    schema's (issue 37, friction 5); open sections and unknown keys are left to their checks."""
    from hookgraph.cli.app import _plus_on_a_field

    assert _plus_on_a_field(["+runner.generate.do_sample=true"]) == (
        "runner.generate.do_sample: a field of the config already; set it without the + "
        "(runner.generate.do_sample=true)"
    )
    assert _plus_on_a_field(["+runner.steps=3"]) is not None
    ok = ["+runner.stpes=5", "+hooks.x={target: a}", "+runner.attribution.head=true", "++runner.steps=3",
          "+data.shape=[3,8,8]", "runner.generate.do_sample=true"]
    assert _plus_on_a_field(ok) is None


def test_a_plain_record_of_token_states_gives_dataset_items_their_token_ids(tmp_path):
    """A record without tokens: true gave dataset items token -1 although the batch had
    input_ids (issue 37, friction 3): the run now keeps each step's ids beside its records.
    The oracle is the prompt the config names, not anything hookgraph computed."""
    import torch

    from tests.runs import make_run

    ids = [[5, 9, 2, 7, 11, 3], [1, 2, 3, 4, 5, 6]]
    out = make_run(
        tmp_path / "run", "model=gpt2_tiny", "data=custom", "data._target_=hookgraph.data.prompts.Prompts",
        f"+data.kwargs.ids={ids}", "runner.batch_size=2", "runner.steps=2", "runner.backward=false",
        "sink.figures=false", "hooks=[]", "+hooks.resid={target: transformer.h.0, action: record}",
    )
    r = hg.load_run(out)
    ds = r.dataset("resid")
    assert len(ds) == 2 * 2 * 6  # steps x batch x positions
    items = [ds[i] for i in range(len(ds))]
    for item in items:  # the n-th step's batch is the prompts again (two prompts, batch 2)
        assert item["token"] == ids[item["row"]][item["position"]], item
    # Values are the recorded hidden states themselves, row by row.
    value = r.records["resid"].entry("transformer.h.0", 1)
    assert torch.equal(items[12 + 7]["x"], value[1, 1])
    # The same ids through the iterable dataset's batches (a whole entry at a time).
    (batch,) = list(r.dataset("resid", iterable=True, batch_size=24))
    assert batch["token"].tolist() == [ids[i][p] for i, p in zip(batch["row"].tolist(), batch["position"].tolist(),
                                                                  strict=True)]


def test_a_batch_set_in_an_earlier_step_gives_no_token_ids_to_a_later_one(tmp_path):
    """In one's own loop set_batch may be called once: a later step's shard must not claim those
    ids (a token that came from another batch would be a wrong label, silently)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Embedding(20, 4), torch.nn.Linear(4, 4))
    first = torch.tensor([[1, 2, 3]])
    with hg.open_run(tmp_path / "run", model, {"h": {"target": "1", "action": "record"}}) as run:
        run.graph.set_batch({"input_ids": first})
        model(first)
        run.step()
        model(torch.tensor([[7, 8, 9]]))
        run.step()
    items = list(hg.load_run(tmp_path / "run").dataset("h"))
    assert [(i["step"], i["token"]) for i in items] == [(0, 1), (0, 2), (0, 3), (1, -1), (1, -1), (1, -1)]


def test_a_tokenizers_batch_encoding_gives_the_token_ids_too(tmp_path):
    """set_batch(tokenizer(...)) hands a BatchEncoding, a Mapping that is not a dict: its ids were
    read as none (token -1 in the dataset and in record's token table), silently."""
    import torch
    from transformers import BatchEncoding

    model = torch.nn.Sequential(torch.nn.Embedding(20, 4), torch.nn.Linear(4, 4))
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    specs = {"h": {"target": "1", "action": "record"},
             "t": {"target": "1", "action": "record", "args": {"tokens": True, "drop_padding": True}}}
    batch = BatchEncoding({"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])})
    with hg.open_run(tmp_path / "run", model, specs) as run:
        run.graph.set_batch(batch)
        model(ids)
        run.step()
    r = hg.load_run(tmp_path / "run")
    assert [i["token"] for i in r.dataset("h")] == [1, 2, 3, 4, 5, 6]
    table = r.records["t"].entry("1", 0)
    assert table["token"].tolist() == [1, 2, 3, 4, 5]  # the padded last token dropped by the mask
