"""Automatic per-bucket planning: compress or not, which codec, which strategy, how many partitions.

``build_plan(..., strategy="auto", codec="auto", partitions="auto", cluster=ClusterModel(...))`` lands here
(:func:`~casync.planner.choose.choose_plan`).  The algorithm follows Espresso (ByteComp) and HiPress:

1. **Candidates.**  Every bucket may use any candidate strategy (``ring``, co-located two-way ``ps``,
   ``allgather``), any candidate codec (default ``none``, ``fp16``, ``onebit``, ``topk:ratio=0.01``) and,
   with ``partitions="auto"``, a few partition counts per strategy (1, 2, 4, N/2, N, 2N and the strategy
   default for ring and PS; 1, 2, 4 for all-gather), never cutting parts below ``MIN_PARTITION_NUMEL``
   elements (HiPress's partitioning rule: a part must be large enough to amortise a transfer).
2. **Fast estimator.**  Each (bucket size, option) gets analytical stage costs from the :class:`Profile`
   and the :class:`ClusterModel`, memoized: per worker, the seconds its compute lane, NIC egress and NIC
   ingress are busy (``alpha + bytes/beta`` per transfer, encode/decode/merge per element, per-task call
   overhead), when that use starts and how long the bucket still runs after it ends, and the bucket's
   isolated makespan (the hop-latency chain of one partition, the transfer slots an all-to-all exchange
   needs under the simulator's list scheduling, pipelining of several partitions).  A pipelined
   timeline over the buckets in ready order — a compute and a network resource per worker, as in
   Espresso's timeline model — combines them into an estimated iteration time, and evaluates all options
   of one bucket at once (NumPy, batched): a few microseconds per bucket and option.
3. **Greedy choice (Espresso).**  Starting from the best uncompressed plan, buckets are visited in priority
   order — largest first, later-ready first among equals; a bucket whose synchronization already hides in
   a bubble (done before the next gradient is ready) is skipped; otherwise it takes the option that lowers
   the estimated iteration time most.  Passes repeat until nothing improves.  The same greedy also starts
   from the best few uniform plans (one option for every bucket).  Then HiPress's selective compression:
   a bucket is compressed only where that saves at least :func:`min_gain` (0.2% of the iteration).
4. **Validation.**  The candidates and the promising fixed uniform plans (one strategy and codec for all
   buckets, default partitions) are run through the real simulator within an op budget
   (``sim_budget_ops``); the best simulated plan is kept, so ``auto`` is never worse in simulation than a
   fixed choice it simulated.  Candidates are not assembled: each distinct (bucket size, option) is
   expanded once into an :class:`~casync.sim.optable.OpTable` fragment and a candidate's table is glued from
   fragments, which simulates exactly as its assembled plan would; only the chosen plan is assembled.
   Small plans (a few thousand ops) are then refined bucket by bucket with the real simulator, and
   compression that does not pay there is undone.

Each bucket's ``note`` says why it got its option, e.g. ``"onebit: -12.3 ms vs none"`` (the estimated
iteration time saved against the best uncompressed option for that bucket, other buckets unchanged),
``"hidden in bubble (40.1 ms to spare)"``, ``"small: kept uncompressed"`` or ``"none: compressing adds
2.0 ms"``.  ``plan.options["planner"]`` records the estimated and simulated iteration time, which
candidate won (``"planner"``, ``"uniform ring/onebit"``, ... ``"(refined with the simulator)"``), how
many simulations ran and how long planning took.

:func:`backward_ready_times` gives a plausible backward-pass profile for ``ready_times``.
"""
from __future__ import annotations

from ..lazy import attach

# imported on first use: a module that needs one planner piece (the estimator, the candidates) loads only that one
__getattr__, __dir__ = attach(__name__, {
    "backward_ready_times": "casync.plan.ready",
    **dict.fromkeys(["DEFAULT_CODECS", "default_strategies"], ".candidates"),
    **dict.fromkeys(["DEFAULT_SIM_BUDGET_OPS", "MUST_SIMULATE_FIXED", "choose_plan"], ".choose"),
    **dict.fromkeys(["Cost", "Estimator", "Option"], ".estimator"),
    **dict.fromkeys(["Planner", "min_gain"], ".search"),
    "timeline_estimate": ".timeline",
})

__all__ = ["DEFAULT_CODECS", "DEFAULT_SIM_BUDGET_OPS", "MUST_SIMULATE_FIXED", "Cost", "Estimator", "Option", "Planner",
           "backward_ready_times", "choose_plan", "default_strategies", "min_gain", "timeline_estimate"]
