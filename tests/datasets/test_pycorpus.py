"""The stdlib language-modelling corpus: a split by file that never moves, a vocabulary from training text only,
a manifest that changes with any byte, batches whose targets are the next tokens, and clear errors."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from casync.datasets.pycorpus import EOS, UNK, held_out, lm_batches, load_corpus, manifest, source_files, tokens


def make_tree(root, files=12):
    for i in range(files):
        sub = root / ("pkg" if i % 3 else "") / f"mod{i}.py"
        sub.parent.mkdir(parents=True, exist_ok=True)
        sub.write_text(f"def f{i}(x):\n    return x + {i}  # common words\n" + "common words\n" * (i + 1))
    return root


def test_tokens_are_words_numbers_marks_and_newlines():
    assert tokens("def f(x_1):\n    return x_1+42") == ["def", "f", "(", "x_1", ")", ":", "\n", "return", "x_1", "+",
                                                          "42"]


def test_the_split_is_by_file_and_the_vocabulary_comes_from_training_text_only(tmp_path):
    root = make_tree(tmp_path)
    corpus = load_corpus(root, vocab_size=8, valid_every=3)
    info = corpus.manifest
    assert set(info["train_files"]).isdisjoint(info["valid_files"])
    assert sorted(info["train_files"] + info["valid_files"]) == sorted(p.relative_to(root).as_posix()
                                                                       for p in source_files(root))
    assert all(held_out(f, 3) for f in info["valid_files"]) and not any(held_out(f, 3) for f in info["train_files"])
    assert corpus.vocab[:2] == (UNK, EOS) and len(corpus.vocab) == 8
    train_words = {t for f in info["train_files"] for t in tokens((root / f).read_text())}
    assert set(corpus.vocab[2:]) <= train_words
    # every file ends with <eos>; out-of-vocabulary tokens are <unk> (id 0)
    assert (corpus.train == 1).sum() == len(info["train_files"])
    assert (corpus.valid == 1).sum() == len(info["valid_files"])
    assert corpus.unk_rate["train"] > 0 and corpus.train.dtype == np.int32


def test_the_manifest_changes_with_any_byte_and_the_split_does_not(tmp_path):
    root = make_tree(tmp_path)
    before = manifest(root, valid_every=3)
    (root / "pkg" / "mod1.py").write_text((root / "pkg" / "mod1.py").read_text() + " ")
    after = manifest(root, valid_every=3)
    assert before["sha256"] != after["sha256"]
    assert (before["train_files"], before["valid_files"]) == (after["train_files"], after["valid_files"])
    assert after["python"] and after["root"] == str(root)


def test_the_standard_library_is_the_default_corpus():
    info = manifest()
    assert info["root"].startswith(sys.base_prefix) or "python" in info["root"].lower()
    assert len(info["train_files"]) > 500 and len(info["valid_files"]) > 50
    assert not any("site-packages" in f for f in info["train_files"] + info["valid_files"])


def test_batches_are_each_ranks_rows_and_targets_are_the_next_tokens():
    ids = np.arange(1000, dtype=np.int32)
    seen = []
    for rank in range(2):
        windows = list(lm_batches(ids, batch_size=3, bptt=5, rank=rank, world=2))
        assert windows and all(x.shape == y.shape == (3, 5) for x, y in windows)
        for x, y in windows:
            assert np.array_equal(y, x + 1)  # the stream is 0, 1, 2, ...: the next token is one more
            seen.append(x)
    rows = np.concatenate(seen).ravel()
    assert len(np.unique(rows)) == len(rows)  # no token read twice, by either rank


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpus(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="holds no .py files"):
        load_corpus(tmp_path)
    (tmp_path / "only.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="each split needs one"):
        load_corpus(tmp_path, valid_every=1000)
    with pytest.raises(ValueError, match="vocab_size"):
        load_corpus(tmp_path, vocab_size=2)
    with pytest.raises(ValueError, match="too few"):
        list(lm_batches(np.arange(10, dtype=np.int32), batch_size=4, bptt=5))
    with pytest.raises(ValueError, match="rank 2"):
        list(lm_batches(np.arange(100, dtype=np.int32), 2, 3, rank=2, world=2))
