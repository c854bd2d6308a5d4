"""The language-model task: a word-level LSTM on the Python standard library's source, Adam, validation loss.

A 4,096-token vocabulary (the training split's most frequent tokens; 7.5 % of its tokens become ``<unk>``) with a
wide input embedding (``EMBED`` = 2,048 per token, projected down to the LSTM's ``WIDTH``) and its own decoder: the
input embedding is 8.4 M of the model's 10.5 M parameters, as the embeddings dominate the LSTM language models DGC
and BytePS-Compress train, and its gradient costs bytes but little compute (a lookup, one small projection per
token).  Adam runs fused (PyTorch's one-pass CPU kernel, ~3x its default's speed here), so the step's compute is
the model's, not the optimizer's loops.  Why not the 16,384 tokens it had: 1-bit Adam's frozen variance diverges
on this task even with exact gradients (likely the decoder's rows of rare words), and a smaller vocabulary alone
does not fix that (benchmarks/results/time_to_accuracy/lm_compressed_adam/); with the decoder synced exactly
(``OneBitAdam(exact_variance=True)``), a small decoder and a wide embedding leave most of the bytes compressible.
DDP allreduce's step on 4 emulated nodes at 1 Gbit, 2 sequences per rank: 90 % sync over 400 steps at load ~4-6
(711 ms against the 71 ms floor, benchmarks/results/time_to_accuracy/lm_exact_variance/netem_seed_0/); 81 % and
76 % in 40-step runs at load ~8-11 and ~24 (sizing/lm_v4096_e2048_b2*.md): the floor slows more than the sync
under load.  Never measured on a quiet host.  Learning rate 0.001
(constant), tuned on the uncompressed run.  Each window of ``bptt`` tokens starts from a zero
state (no state carried between windows, so a step's gradient depends on its batch alone, as DDP assumes).
Validation is the mean cross-entropy over the first ``eval_tokens`` tokens of the held-out files, in the same
windows.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterator

import numpy as np

from ..datasets.pycorpus import Corpus, lm_batches, load_corpus
from .base import Task

VOCAB, EMBED, WIDTH, BPTT, EVAL_TOKENS = 4096, 2048, 256, 32, 32768


@lru_cache(maxsize=2)
def load(path: Any = None) -> Corpus:
    return load_corpus(path, vocab_size=VOCAB)


def make_model(vocab: int, embed: int, width: int, seed: int) -> Any:
    """The seeded ``torch.nn`` LSTM language model: a ``vocab`` x ``embed`` embedding, a projection to ``width``,
    one LSTM layer ``width`` wide and a ``width`` -> ``vocab`` decoder (probes size it otherwise)."""
    import torch

    class LSTMLanguageModel(torch.nn.Module):
        """Embedding (``embed`` wide) -> projection to ``width`` -> LSTM -> decoder."""

        def __init__(self, vocab: int, embed: int, width: int):
            super().__init__()
            self.embedding = torch.nn.Embedding(vocab, embed)
            self.projection = torch.nn.Linear(embed, width)
            self.lstm = torch.nn.LSTM(width, width, batch_first=True)
            self.decoder = torch.nn.Linear(width, vocab)

        def forward(self, tokens: Any) -> Any:
            out, _ = self.lstm(self.projection(self.embedding(tokens)))
            return self.decoder(out)

    torch.manual_seed(seed)
    return LSTMLanguageModel(vocab, embed, width)


def build_model(data: Corpus, seed: int) -> Any:
    return make_model(len(data.vocab), EMBED, WIDTH, seed)


def optimizer(params: Any, lr: float) -> Any:
    import torch

    return torch.optim.Adam(params, lr=lr, fused=True)


def batches(data: Corpus, rank: int, world: int, batch_size: int, seed: int = 0) -> Iterator[tuple[Any, Any]]:
    """Windows of the training stream for this rank, epoch after epoch (each epoch starts ``seed``-shifted)."""
    import torch

    epoch = 0
    while True:
        shift = int(np.random.default_rng([seed, epoch]).integers(0, BPTT))
        for x, y in lm_batches(data.train[shift:], batch_size, BPTT, rank, world):
            yield torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))
        epoch += 1


def loss(model: Any, inputs: Any, targets: Any) -> Any:
    import torch

    logits = model(inputs)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def evaluate(model: Any, data: Corpus) -> float:
    """Mean cross-entropy (nats per token) over the first :data:`EVAL_TOKENS` validation tokens."""
    import torch

    ids = data.valid[:EVAL_TOKENS + 1]
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for x, y in lm_batches(ids, batch_size=max(1, min(16, (len(ids) - 1) // BPTT)), bptt=BPTT):
            n = y.size
            total += float(loss(model, torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)))) * n
            count += n
    model.train(was_training)
    return total / count


LM = Task(name="lm", metric="validation loss", higher_is_better=False, load=load, model=build_model,
          optimizer=optimizer, batches=batches, loss=loss, evaluate=evaluate,
          defaults={"lr": 1e-3, "batch_size": 2})
