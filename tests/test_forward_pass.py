"""``attnflow.forward_pass(checkpoint, texts)``: one entry per text (``hidden``,
``attention``, ``tokens``, ``pooled``), against ``encode`` on the padded batch it wraps and
against the plain numpy forward pass of ``test_forward`` on each text alone. The
tokenizer is a stand-in (the ``tokenizers`` package is optional): a fixed word list."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from test_forward import bert_checkpoint, reference

import attnflow as af
from attnflow.io.encoder_weights import load_encoder_weights
from attnflow.networks import encoder as E

WORDS = {"[CLS]": 2, "[SEP]": 3, "the": 17, "cat": 5, "sat": 33, "on": 9, "mat": 21, "a": 8}


@dataclass
class _Encoding:
    ids: list
    tokens: list
    type_ids: list


class _Tokenizer:
    def encode(self, text):
        toks = ["[CLS]", *text.lower().replace(".", "").split(), "[SEP]"]
        return _Encoding([WORDS[t] for t in toks], toks, [0] * len(toks))


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(E, "load_tokenizer", lambda path: _Tokenizer())
    return bert_checkpoint(tmp_path / "bert")


def test_forward_pass_is_encode_one_text_at_a_time(checkpoint):
    folder, t, cfg = checkpoint
    texts = ["The cat sat on the mat.", "A cat.", "the mat"]
    f = af.forward_pass(folder, texts)
    assert len(f) == 3 and all(isinstance(e, af.ForwardPass) for e in f)
    assert f[1].tokens == ("[CLS]", "a", "cat", "[SEP]")
    out = E.encode(folder, texts)
    for i, e in enumerate(f):
        n = len(e.tokens)
        assert e.hidden.shape == (3, n, 12) and e.attention.shape == (2, 3, n, n)
        np.testing.assert_array_equal(e.hidden, np.asarray(out.hidden_states)[:, i, :n])
        np.testing.assert_array_equal(e.attention, np.asarray(out.attentions)[:, i, :, :n, :n])
        np.testing.assert_array_equal(e.pooled, np.asarray(out.pooled)[i])
        np.testing.assert_allclose(e.attention.sum(-1), 1.0, rtol=0, atol=1e-14)
        # the text alone, in plain numpy: padding changes nothing on its tokens
        ids = np.array([[WORDS[w] for w in e.tokens]])
        hs, att, pooled = reference(t, cfg, ids, np.ones_like(ids), np.zeros_like(ids))
        np.testing.assert_allclose(e.hidden, hs[:, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(e.attention, att[:, 0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(e.pooled, pooled[0], rtol=1e-12, atol=1e-13)


def test_forward_pass_takes_one_text_and_loaded_weights(checkpoint):
    folder, _, _ = checkpoint
    one = af.forward_pass(folder, "The cat sat.")
    w = load_encoder_weights(folder)
    again = af.forward_pass(w, ["The cat sat."], tokenizer_from=folder)
    assert len(one) == 1 and one[0].tokens == again[0].tokens
    np.testing.assert_array_equal(one[0].hidden, again[0].hidden)
    with pytest.raises(ValueError, match="texts must be a non-empty list"):
        af.forward_pass(folder, [])
