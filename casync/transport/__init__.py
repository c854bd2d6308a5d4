"""Transports the per-rank executor moves payload bytes over (``base``: the Channel contract and an in-process
hub; ``torchdist``: a torch.distributed process group)."""
