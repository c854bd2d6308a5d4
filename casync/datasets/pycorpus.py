"""A language-modelling corpus every machine has: the Python standard library's source files, read offline.

Files are split, not lines: a file whose path (relative to the corpus root) hashes to 0 modulo ``valid_every`` is
held out for validation, so no validation text is ever trained on, and the split does not move when files are
added elsewhere.  Tokens are identifiers, numbers, single punctuation marks and newlines (one regular expression,
nothing fetched); the vocabulary is the training split's ``vocab_size - 2`` most frequent tokens plus ``<unk>``
and ``<eos>`` (the end of a file), ties broken alphabetically.  A large vocabulary makes a model's embedding and
output layers most of its parameters, as in the language models DGC and BytePS-Compress train.

:func:`manifest` names the files and hashes their contents: another Python version gives another corpus, and a
result says which one it used.  ``root`` takes any folder of ``.py`` files instead (``suffix`` for other text).
"""
from __future__ import annotations

import hashlib
import platform
import re
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

#: identifiers, numbers, newlines, and every other non-space character on its own
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|\n|[^\sA-Za-z0-9_]")
UNK, EOS = "<unk>", "<eos>"


def stdlib_root() -> Path:
    """Where this interpreter's standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: str | Path | None = None, suffix: str = ".py") -> list[Path]:
    """The corpus's files under ``root`` (default: the standard library, without site-packages), sorted."""
    base = Path(root) if root is not None else stdlib_root()
    if not base.is_dir():
        raise FileNotFoundError(f"corpus folder {str(base)!r} does not exist (or is not a folder)")
    files = sorted(p for p in base.rglob(f"*{suffix}") if p.is_file() and "site-packages" not in p.parts
                   and "dist-packages" not in p.parts)
    if not files:
        raise FileNotFoundError(f"corpus folder {str(base)!r} holds no {suffix} files")
    return files


def held_out(relative: str, valid_every: int) -> bool:
    """Whether the file at ``relative`` (a POSIX path below the root) belongs to the validation split."""
    return int(hashlib.sha1(relative.encode()).hexdigest(), 16) % valid_every == 0


def manifest(root: str | Path | None = None, suffix: str = ".py", valid_every: int = 10) -> dict[str, Any]:
    """What a result must record of its corpus: the root, the Python that shipped it, the files of each split and
    one SHA-256 over every file's path and bytes."""
    base = Path(root) if root is not None else stdlib_root()
    digest = hashlib.sha256()
    train, valid = [], []
    for path in source_files(base, suffix):
        relative = path.relative_to(base).as_posix()
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
        (valid if held_out(relative, valid_every) else train).append(relative)
    return {"root": str(base), "python": platform.python_version(), "suffix": suffix, "valid_every": valid_every,
            "sha256": digest.hexdigest(), "train_files": train, "valid_files": valid}


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


@dataclass(frozen=True)
class Corpus:
    """Token ids of the two splits (int32, files joined with ``<eos>``), the vocabulary (id -> token) and the
    manifest of the files they came from."""

    train: np.ndarray
    valid: np.ndarray
    vocab: tuple[str, ...]
    manifest: dict[str, Any]

    @property
    def unk_rate(self) -> dict[str, float]:
        """The fraction of each split's tokens outside the vocabulary."""
        return {name: float(np.mean(ids == 0)) if ids.size else 0.0
                for name, ids in (("train", self.train), ("valid", self.valid))}


def load_corpus(root: str | Path | None = None, vocab_size: int = 16384, valid_every: int = 10,
                suffix: str = ".py") -> Corpus:
    """Read, split and number the corpus under ``root`` (default: the standard library)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 3:
        raise ValueError(f"vocab_size must be an int >= 3 (<unk>, <eos> and one token), got {vocab_size!r}")
    if isinstance(valid_every, bool) or not isinstance(valid_every, int) or valid_every < 2:
        raise ValueError(f"valid_every must be an int >= 2, got {valid_every!r}")
    info = manifest(root, suffix, valid_every)
    base = Path(info["root"])
    split = {name: [tokens(_read(base / rel)) for rel in info[f"{name}_files"]] for name in ("train", "valid")}
    if not split["train"] or not split["valid"]:
        raise ValueError(f"corpus {str(base)!r}: {len(info['train_files'])} training and {len(info['valid_files'])} "
                         f"validation files; each split needs one (more files, or another valid_every)")
    counts = Counter(t for file in split["train"] for t in file)
    common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab_size - 2]
    vocab = (UNK, EOS, *(t for t, _ in common))
    index = {t: i for i, t in enumerate(vocab)}
    ids = {name: np.array([index.get(t, 0) for file in files for t in (*file, EOS)], np.int32)
           for name, files in split.items()}
    return Corpus(ids["train"], ids["valid"], vocab, info)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def lm_batches(ids: np.ndarray, batch_size: int, bptt: int, rank: int = 0, world: int = 1
               ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(inputs, targets)`` windows of ``batch_size`` x ``bptt`` tokens for rank ``rank`` of ``world``: the
    stream is cut into ``world * batch_size`` equal rows (each rank its own ``batch_size`` of them), read
    ``bptt`` tokens at a time; targets are the inputs shifted by one token, so a recurrent model can carry its
    state from one window to the next."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    if batch_size < 1 or bptt < 1:
        raise ValueError(f"batch_size and bptt must be >= 1, got {batch_size} and {bptt}")
    rows = world * batch_size
    length = (len(ids) - 1) // rows
    if length < bptt:
        raise ValueError(f"{len(ids)} tokens are too few for {rows} rows of at least {bptt + 1}")
    mine = slice(rank * batch_size, (rank + 1) * batch_size)
    inputs = ids[:rows * length].reshape(rows, length)[mine]
    targets = ids[1:rows * length + 1].reshape(rows, length)[mine]
    for start in range(0, length - bptt + 1, bptt):
        yield inputs[:, start:start + bptt], targets[:, start:start + bptt]
