"""Op points against nnsight's ``.source`` on the same eager GPT-2: the same op's output,
and the same edit of the attention pattern, give equal values."""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from tests.hf_models import eager_gpt2 as _gpt2

transformers = pytest.importorskip("transformers")
nnsight = pytest.importorskip("nnsight")


def test_op_outputs_and_pattern_edit_equal_nnsight_source():
    model = _gpt2()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    wrapped = nnsight.NNsight(model)
    with torch.no_grad(), wrapped.trace(ids):
        inner = wrapped.transformer.h[1].attn.source.attention_interface_1.source
        scores = inner.torch_matmul_0.output.save()
        pattern = inner.nn_functional_softmax_0.output.save()
    with torch.no_grad(), wrapped.trace(ids):
        inner = wrapped.transformer.h[1].attn.source.attention_interface_1.source
        inner.nn_functional_softmax_0.output[:, :, :, 0] = 0
        edited = wrapped.output.logits.save()
    graph = hg.compile(model, {
        "mm": {"target": "transformer.h.1.attn", "op": "matmul.0", "action": "record"},
        "pat": {"target": "transformer.h.1.attn", "op": "softmax", "action": "record"},
    })
    with graph.attach(), torch.no_grad():
        plain = model(ids).logits
    torch.testing.assert_close(graph.records["mm"]["transformer.h.1.attn:matmul.0"][0], scores, rtol=0, atol=0)
    torch.testing.assert_close(graph.records["pat"]["transformer.h.1.attn:softmax.0"][0], pattern, rtol=0, atol=0)
    edit = hg.compile(model, {"no_bos": {"target": "transformer.h.1.attn", "op": "softmax", "action": "mask",
                                         "args": {"index": 0, "dim": 3}}})
    with edit.attach(), torch.no_grad():
        got = model(ids).logits
    assert not torch.equal(plain, edited)
    torch.testing.assert_close(got, edited, rtol=0, atol=1e-6)
