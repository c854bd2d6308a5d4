"""``choose_plan``: the planner's whole call — candidates, Espresso's greedy, the selective-compression
rule, validation with the simulator.

Starting points are uniform plans (one option for every bucket) and each bucket's best option alone;
Espresso's greedy improves them bucket by bucket on the estimate; the selective-compression rule
(:mod:`casync.planner.selective`) turns each into a plan that compresses only where that gains
``min_gain`` (a size threshold when all gradients are ready together); then the candidates and the fixed
uniform plans go through the real simulator — as compact templates wherever those are exact, within an op
budget otherwise — and the plan returned is, among those that simulate no slower than the best fixed plan
and within ``min_gain`` of the fastest, the one that compresses least (ties go to no compression), so
``auto`` is never slower in simulation than a fixed choice it simulated.
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from casync.primitives import feedback

from ..plan.assemble import DEFAULT_BUCKET_BYTES, assemble_plan, given_groups
from ..plan.checks import check_bool, check_int, check_op
from ..plan.stamp import gc_paused
from ..plan.syncplan import SyncPlan
from ..plan.tensors import tensor_specs
from ..sim.costmodel import ClusterModel, Profile
from ..sim.simulator import run_table
from .candidates import normalize_codecs, normalize_partitions, normalize_strategies
from .search import Planner, min_gain
from .selective import regularize, trim

#: Real-simulator budget of a planning call, in plan ops simulated (about 3 us each on the 2-core development
#: machine, fragments and gluing included); compact templates count their own (few) ops.
DEFAULT_SIM_BUDGET_OPS = 100_000
#: Planner candidates are validated when estimated within this factor of the best so far, or when this cheap.
VALIDATE_MARGIN = 1.3
#: Fixed uniform plans are simulated unless estimated this much slower than the best so far: "auto" must not
#: lose to a fixed choice, and the estimator can be 50% pessimistic (e.g. PS with a 1-bit codec).
UNIFORM_VALIDATE_MARGIN = 2.0
CHEAP_OPS = 5_000
#: The best-estimated fixed uniform plans that are always simulated, beyond the budget if need be; the others
#: are rechecked with estimates corrected by what simulation showed for their strategy.  (With only one, auto
#: lost to a fixed plan by up to 20% in 3 of 48 what-if cells: the recheck alone is not enough.)
MUST_SIMULATE_FIXED = 3
#: A fixed plan not yet simulated is simulated when its estimate, corrected by the simulated/estimated ratio
#: of the simulated plans using its strategy, is within this fraction of the best simulated time.
FIXED_RECHECK_SLACK = 0.05
#: Uniform plans (best estimated first) that start the selective rule, and those that also start the greedy.
START_UNIFORM = 3
GREEDY_UNIFORM = 1
#: With all gradients ready together and more buckets than this, the greedy (quadratic in buckets) is left
#: out: the selective rule decides per size, from each bucket's best option and the best uniform plans.
GREEDY_MAX_BUCKETS = 48


def choose_plan(tensors: Any, workers: int = 4, cluster: ClusterModel | None = None, profile: Profile | None = None,
                strategies: Any = "auto", codecs: Any = "auto", partitions: Any = "auto",
                ready_times: Mapping[str, float] | None = None, *, two_way: bool = True,
                error_feedback: bool | str = "auto", op: str = "mean", bucket_bytes: int | None = None, seed: int = 0,
                sim_budget_ops: int = DEFAULT_SIM_BUDGET_OPS, options: Mapping[str, Any] | None = None,
                buckets: Sequence[Sequence[str]] | None = None) -> SyncPlan:
    """Choose strategy, codec and partitions per bucket for ``workers`` on ``cluster``; returns the plan.

    ``strategies``: ``"auto"`` (ring, ps, allgather) or names; ``codecs``: ``"auto"`` (none, fp16, onebit,
    topk:ratio=0.01), a list of specs, or one spec; ``partitions``: ``"auto"`` (a few per strategy), ``None``
    (each strategy's default) or an int.  ``cluster`` defaults to what :func:`~casync.sim.simulator.simulate`
    assumes (all workers on one node); ``profile`` to :meth:`Profile.default`; ``ready_times`` maps tensor
    names to the second their gradient is ready (see :func:`backward_ready_times`).  ``sim_budget_ops``
    bounds the real-simulator checks (plan ops simulated); 0 trusts the estimator alone.  ``buckets``: the
    gradient buckets to plan for, as lists of tensor names (each tensor in exactly one, in backward order; a DDP
    job's own buckets), instead of fusing ``tensors`` into buckets of about ``bucket_bytes``.

    Every bucket's ``note`` says why it got its option; ``plan.options["planner"]`` holds the estimated
    and simulated iteration times and which candidate plan won.
    """
    with gc_paused():
        return _choose_plan(tensors, workers, cluster, profile, strategies, codecs, partitions, ready_times,
                            two_way=two_way, error_feedback=error_feedback, op=op, bucket_bytes=bucket_bytes,
                            seed=seed, sim_budget_ops=sim_budget_ops, options=options, buckets=buckets)


def _choose_plan(tensors: Any, workers: int, cluster: ClusterModel | None, profile: Profile | None, strategies: Any,
                 codecs: Any, partitions: Any, ready_times: Mapping[str, float] | None, *, two_way: bool,
                 error_feedback: bool | str, op: str, bucket_bytes: int | None, seed: int, sim_budget_ops: int,
                 options: Mapping[str, Any] | None, buckets: Sequence[Sequence[str]] | None = None) -> SyncPlan:
    started = time.perf_counter()
    check_int("workers", workers, 1)
    check_bool("two_way", two_way)
    feedback.check(error_feedback)
    check_op(op)
    check_int("bucket_bytes", bucket_bytes, 0, allow_none=True)
    check_int("seed", seed, 0)
    check_int("sim_budget_ops", sim_budget_ops, 0)
    strategies = normalize_strategies(strategies)
    codec_objs = normalize_codecs(codecs)
    partitions = normalize_partitions(partitions)
    cluster = cluster if cluster is not None else ClusterModel(nodes=1, workers_per_node=workers)
    if not isinstance(cluster, ClusterModel):
        raise TypeError(f"cluster must be a casync.ClusterModel, got {type(cluster).__name__}")
    if cluster.nodes * cluster.workers_per_node < workers:
        raise ValueError(f"cluster has room for {cluster.nodes * cluster.workers_per_node} workers "
                         f"(nodes x workers_per_node), plan has {workers}")
    profile = profile if profile is not None else Profile.default()
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a casync.sim.costmodel.Profile, got {type(profile).__name__}")
    for c in codec_objs:
        feedback.resolve(c, error_feedback)  # an explicit True on a codec without sound error feedback is refused
        try:
            profile.encode_s(str(c), 1)
            profile.decode_s(str(c), 1)
        except KeyError as exc:
            raise ValueError(f"cannot plan with codec {str(c)!r}: {exc.args[0]}") from None
    specs = tensor_specs(tensors)
    groups = None if buckets is None else given_groups(specs, buckets)
    bucket_bytes = DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    planner = Planner(specs, workers, cluster, profile, strategies=strategies, codecs=codec_objs,
                      partitions=partitions, bucket_bytes=bucket_bytes, ready_times=ready_times,
                      two_way=two_way, error_feedback=error_feedback, op=op, groups=groups)

    # 1. uniform plans (every strategy x codec x partition rule), estimated
    rules: list[Any] = ["default"]
    if partitions == "auto":
        rules += sorted({k for b in planner.buckets for o in b.options for k in [o.partitions]})
    uniform: dict[tuple[str, str, Any], list[int]] = {}
    for s in strategies:
        for c in codec_objs:
            for rule in rules:
                a = planner.uniform(s, c, rule)
                if a is not None and tuple(a) not in {tuple(v) for v in uniform.values()}:
                    uniform[(s, str(c), rule)] = a
    scored = sorted(uniform.items(), key=lambda kv: planner.estimate(kv[1]))
    # 2. candidates: each bucket's best option alone and the best uniform plans, improved by Espresso's greedy
    # (from the best plan without compression skipping buckets hidden in a bubble), each made to follow the
    # selective-compression rule
    base_plans = [a for (s, c, r), a in scored if c == str(planner.base_codec)]
    starts = [planner.isolated_best()] + [a for _, a in scored[:START_UNIFORM]]
    greedy = []
    if not planner.monotone or len(planner.buckets) <= GREEDY_MAX_BUCKETS:
        greedy = [planner.greedy(base_plans[0], skip_hidden=True)] + [planner.greedy(a, skip_hidden=False)
                                                                       for _, a in scored[:GREEDY_UNIFORM]]
    candidates: list[list[int]] = []
    for a in starts + greedy:
        for r in regularize(planner, a):
            if r not in candidates:
                candidates.append(r)
    best = min(candidates, key=planner.estimate)
    best_est = planner.estimate(best)[0]

    # 3. validate with the real simulator, within the op budget: the candidates and the fixed uniform plans
    # (default partitions) the estimate does not rule out (cheap ones always)
    bucket_ready = {b.name: b.ready for b in planner.buckets}
    budget = sim_budget_ops
    sims = 0
    sim_ops = 0
    # whatever the budget, the planner's pick and the best-estimated fixed plans are simulated: "auto" must
    # not lose to a fixed choice in simulation, and at scale the estimator alone can be far off
    defaults = sorted((a for (s, c, rule), a in uniform.items() if rule == "default"), key=planner.estimate)
    must = {tuple(best)} | {tuple(a) for a in defaults[:MUST_SIMULATE_FIXED]}

    def run(assign: list[int]) -> float | None:
        """Simulated iteration time of ``assign`` (exactly what simulate() gives on its assembled plan)."""
        nonlocal budget, sims, sim_ops
        ops = planner.ops(assign)
        if ops > budget and tuple(assign) not in must:
            return None
        budget -= ops
        sims += 1
        sim_ops += ops
        return run_table(planner.table(assign), cluster, profile, bucket_ready, records=False).iteration_time

    queue: list[tuple[float, int, str, list[int]]] = []
    for a in candidates:
        queue.append((planner.estimate(a)[0], 0 if a == best else 2, "planner", a))
    for (s, c, rule), a in uniform.items():
        if rule == "default":
            queue.append((planner.estimate(a)[0], 1, f"uniform {s}/{c}", a))
    queue.sort(key=lambda x: (min(x[1], 1), x[0]))
    simulated: list[tuple[float, str, list[int]]] = []
    seen: set[tuple[int, ...]] = set()
    for est, _, label, a in queue:
        if tuple(a) in seen:
            continue
        seen.add(tuple(a))
        ref = min(x[0] for x in simulated) if simulated else best_est
        cheap = planner.ops(a) <= CHEAP_OPS
        margin = UNIFORM_VALIDATE_MARGIN if label.startswith("uniform") else VALIDATE_MARGIN
        if est > margin * ref and not cheap and tuple(a) not in must:
            continue
        t = run(a)
        if t is not None:
            simulated.append((t, label, a))
    rechecked = _recheck_fixed(planner, uniform, simulated, must, run)

    # 4. the plan: no slower in simulation than the best fixed plan simulated, within min_gain of the fastest,
    # and of those the one that compresses least (ties go to no compression)
    plain_time = None  # simulated time of the chosen plan without compression, where the rule measured it
    if simulated:
        fastest = min(t for t, _, _ in simulated)
        fixed_best = min([t for t, label, _ in simulated if label.startswith("uniform")], default=float("inf"))
        limit = min(fixed_best, fastest + min_gain(fastest))
        allowed = [x for x in simulated if x[0] <= limit]
        sim_time, winner, best = min(allowed, key=lambda x: (planner.compressed(x[2]), x[0]))
        if planner.monotone and planner.compressed(best):
            # fewer sizes compressed, by the simulator: the estimate can misjudge small buckets
            trimmed = trim(planner, best, run, limit)
            if trimmed is not None:
                plain_time = trimmed[2]
                if trimmed[0] != best:
                    best, sim_time = trimmed[0], trimmed[1]
                    winner = f"{winner}, smaller sizes uncompressed"
                    simulated.append((sim_time, winner, best))
    else:
        sim_time, winner = None, "planner"

    # 5. the plan, with a note per bucket and what the planner did in plan.options["planner"]
    candidates_info = [dict(plan=label, estimated_s=planner.estimate(a)[0], simulated_s=t)
                       for t, label, a in sorted(simulated, key=lambda x: x[0])]
    notes = planner.notes(best)
    # the smallest bucket the plan compresses (None where trimming left it compressing nothing)
    cut = min((b.numel for b, j in zip(planner.buckets, best) if j not in b.baseline), default=None)
    if plain_time is not None and sim_time is not None and cut is not None:
        why = (f"compressing the buckets of {cut:,} elements and more simulated {(plain_time - sim_time) * 1e3:.1f} ms "
               "faster than compressing none")
        notes = [f"{note}; {why}" if j not in b.baseline or b.numel < cut else note
                 for note, b, j in zip(notes, planner.buckets, best)]
    elif winner.startswith("uniform") and sim_time is not None:
        # a fixed choice won in simulation: the per-bucket estimates alone would not have picked it, say so
        mix = min((t for t, label, _ in simulated if label == "planner"), default=None)
        why = (f"{winner.split(' ', 1)[1]} for every bucket simulated fastest ({sim_time * 1e3:.1f} ms"
               + (f"; per-bucket mix {mix * 1e3:.1f} ms)" if mix is not None else ")"))
        notes = [f"{note} by estimate; {why}" for note in notes]
    chose_s = time.perf_counter() - started
    plan = assemble_plan(specs, workers, planner.groups, planner.choices(best, notes),
                         error_feedback=error_feedback, op=op, templates=planner.templates)
    plan.options.update(options or {})
    plan.options.setdefault("strategy", "auto")
    plan.options.setdefault("codec", "auto")
    plan.options.setdefault("partitions", partitions)
    plan.options.update(two_way=two_way, bucket_bytes=None if groups is not None else bucket_bytes, seed=seed,
                        servers=None, **({"buckets": "given"} if groups is not None else {}), planner=dict(
        estimated_s=planner.estimate(best)[0], simulated_s=sim_time, chosen=winner, simulations=sims,
        simulated_ops=sim_ops, compact=planner.exact_compact(best),
        rechecked_fixed=rechecked, candidates=candidates_info,
        strategies=list(strategies), codecs=[str(c) for c in codec_objs], partitions=partitions,
        min_gain_s=min_gain(sim_time if sim_time is not None else planner.estimate(best)[0]),
        cluster=cluster.to_dict(), ready_s=[b.ready for b in planner.buckets], choose_s=chose_s,
        seconds=time.perf_counter() - started))
    return plan


def _recheck_fixed(planner: Planner, uniform: dict[tuple[str, str, Any], list[int]],
                   simulated: list[tuple[float, str, list[int]]], must: set[tuple[int, ...]], run: Any) -> int:
    """The estimator's error is mostly per strategy (e.g. 50% pessimistic for PS with a 1-bit codec): correct
    the estimates of the fixed plans not simulated by what simulation showed for their strategy, and simulate,
    whatever the budget, every one that could still beat the best simulated plan.  Returns how many."""
    fixed = {tuple(a): (s, a) for (s, c, rule), a in uniform.items() if rule == "default"}
    tried = {tuple(a) for _, _, a in simulated}
    rechecked = 0
    while simulated:
        ratios: dict[str, list[float]] = {}  # strategy -> simulated / estimated of the plans using it
        for t, label, a in simulated:
            ratio = t / max(planner.estimate(a)[0], 1e-12)
            for strategy in {b.options[j].strategy for b, j in zip(planner.buckets, a)}:
                ratios.setdefault(strategy, []).append(ratio)
        if not ratios:
            break
        # a strategy no simulated plan used gets the benefit of the doubt: as pessimistic as the margin allows
        unknown = min(min(r) for r in ratios.values()) / UNIFORM_VALIDATE_MARGIN
        best_t = min(x[0] for x in simulated)
        pending = sorted((planner.estimate(a)[0] * min(ratios.get(s, [unknown])), a) for key, (s, a) in fixed.items()
                         if key not in tried)
        if not pending or pending[0][0] > (1 + FIXED_RECHECK_SLACK) * best_t:
            break
        _, a = pending[0]
        tried.add(tuple(a))
        must.add(tuple(a))
        rechecked += 1
        t = run(a)
        if t is not None:
            label = next(f"uniform {s}/{c}" for (s, c, rule), u in uniform.items() if rule == "default" and u == a)
            simulated.append((t, label, a))
    return rechecked
