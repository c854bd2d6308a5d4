"""casync from the training script you already have: a DDP communication hook and a DistributedOptimizer.

    state = casync.torch.CasyncState(strategy="ring", codec="onebit")
    ddp.register_comm_hook(state, casync.torch.comm_hook)

    opt = casync.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            model.named_parameters(), codec="onebit")

Each rank runs its share of a casync plan (the same primitives and codecs as every engine, bit-identical to
``casync.LocalEngine``) on process groups casync creates for itself with its own timeout
(``casync.torch.group``).  ``import casync`` does not import this package (nor torch).  Importing it sets
the process's allocator to keep freed buffers (``casync.engines.memory``; import it before the first
backward pass, while torch's threads have no heaps of their own yet).
"""
from ..engines.memory import keep_freed_memory
from .hook import comm_hook
from .onebit_adam import OneBitAdam
from .optimizer import DistributedOptimizer
from .state import CasyncState

keep_freed_memory()

__all__ = ["CasyncState", "DistributedOptimizer", "OneBitAdam", "comm_hook"]
