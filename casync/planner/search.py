"""The planner's search over per-bucket options: Espresso's greedy, HiPress's selective compression, notes.

:class:`Planner` holds every bucket's candidate options and their estimated costs, evaluates assignments
(one option per bucket) on the Espresso timeline, and glues the simulator's op table of an assignment
from per-bucket fragments; :func:`casync.planner.choose.choose_plan` drives it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from casync.primitives import feedback
from casync.primitives.codecs import Codec, get_codec
from casync.strategies import get_strategy

from ..plan.assemble import (BucketChoice, assemble_plan, bucket_partitions, bucket_priority, compact_is_exact,
                             effective_partitions, make_buckets, name_buckets, structure_key)
from ..plan.ready import bucket_ready_times
from ..plan.specs import TensorSpec
from ..sim.costmodel import ClusterModel, Profile
from ..sim.optable import OpTable
from .candidates import partition_candidates
from .estimator import Cost, Estimator, Option
from .timeline import Stack, Timeline, better

#: Buckets up to this size whose compression never pays in isolation are reported as "small".
SMALL_BYTES = 1 << 20
#: Compression must save at least this much iteration time (the larger of the two) to be chosen over none:
#: 1% of the iteration, and never less than 50 us (HiPress's selective compression: small gains are noise).
MIN_GAIN_S = 50e-6
MIN_GAIN_FRAC = 0.01


def min_gain(iteration_s: float) -> float:
    """Least predicted saving that justifies compression: 1% of the iteration, at least 50 us."""
    return max(MIN_GAIN_S, MIN_GAIN_FRAC * iteration_s)


@dataclass
class PlanBucket:
    """A bucket as the planner sees it: its options, their estimated costs, which are uncompressed."""

    name: str
    group: list[TensorSpec]
    numel: int
    ready: float
    options: list[Option] = field(default_factory=list)
    costs: list[Cost] = field(default_factory=list)
    stack: Stack | None = None
    index: dict[tuple[str, str, int], int] = field(default_factory=dict)
    baseline: list[int] = field(default_factory=list)  # options with the baseline (uncompressed) codec


class Planner:
    """Chooses one :class:`Option` per bucket; see the module docstring.  Use :func:`choose_plan`."""

    def __init__(self, specs: list[TensorSpec], workers: int, cluster: ClusterModel, profile: Profile, *,
                 strategies: Sequence[str], codecs: Sequence[Codec], partitions: Any, bucket_bytes: int,
                 ready_times: Mapping[str, float] | None, two_way: bool, error_feedback: bool | str, op: str = "mean",
                 groups: list[list[TensorSpec]] | None = None):
        self.specs = specs
        self.workers = workers
        self.cluster = cluster
        self.profile = profile
        self.strategies = tuple(strategies)
        self.codecs = tuple(codecs)
        self.partitions = partitions
        self.two_way = two_way
        self.error_feedback = error_feedback
        self.op = op
        self.groups = name_buckets(specs, groups if groups is not None else make_buckets(specs, bucket_bytes))
        ready = bucket_ready_times(self.groups, ready_times, specs)
        self.est = Estimator(workers, cluster, profile, error_feedback=error_feedback, two_way=two_way, op=op)
        none = get_codec("none")
        self.base_codec = none if none in self.codecs else self.codecs[0]
        self.buckets: list[PlanBucket] = []
        for (name, group), r in zip(self.groups, ready):
            numel = sum(s.numel for s in group)
            b = PlanBucket(name=name, group=group, numel=numel, ready=r)
            for strategy in self.strategies:
                for k in partition_candidates(strategy, workers, numel, partitions):
                    for codec in self.codecs:
                        b.index[(strategy, str(codec), k)] = len(b.options)
                        if codec == self.base_codec:
                            b.baseline.append(len(b.options))
                        b.options.append(Option(strategy, codec, k))
            b.costs = [self.est.cost(numel, o) for o in b.options]
            b.stack = Stack.of(b.costs)
            self.buckets.append(b)
        self.timeline = Timeline([b.ready for b in self.buckets], workers, self.est.R, self.est.backward)
        #: all gradients ready together: selective compression is then a size threshold (casync.planner.selective)
        self.monotone = len({b.ready for b in self.buckets}) <= 1
        #: workers are interchangeable on this cluster: plans whose every bucket has an exact compact template
        #: are simulated as templates (the full plan's iteration time, O(N) ops per bucket)
        self.symmetric = cluster.asymmetry(workers) is None
        self._tables: dict[tuple[int, str, str, int, bool], OpTable] = {}  # (size, option, compact) -> table
        self._bases: dict[tuple, tuple[Any, OpTable, tuple]] = {}  # structure -> (template, its table, partitions)
        self._exact_memo: dict[tuple[int, str, str, int], bool] = {}
        self._runs: dict[tuple[int, ...], tuple[float, float, list[float], list[tuple]]] = {}
        self.templates: dict[tuple, Any] = {}  # assemble_plan's structure templates, shared by every fragment
        # Espresso's priority: largest first, later-ready first among equals
        self.priority = sorted(range(len(self.buckets)),
                               key=lambda i: (-self.buckets[i].numel, -self.buckets[i].ready, i))

    def option(self, b: int, strategy: str, codec: Codec, partitions: int) -> int:
        """The index of bucket ``b``'s option (strategy, codec, partitions), added (and estimated) if new."""
        bucket = self.buckets[b]
        key = (strategy, str(codec), partitions)
        j = bucket.index.get(key)
        if j is None:
            j = bucket.index[key] = len(bucket.options)
            bucket.options.append(Option(strategy, codec, partitions))
            bucket.costs.append(self.est.cost(bucket.numel, bucket.options[j]))
            if codec == self.base_codec:
                bucket.baseline.append(j)
            bucket.stack = Stack.of(bucket.costs)
        return j

    def compressed(self, assign: Sequence[int]) -> int:
        """Elements in buckets that ``assign`` compresses (uses another codec than the baseline for)."""
        return sum(b.numel for b, j in zip(self.buckets, assign) if j not in b.baseline)

    # -- evaluation ----------------------------------------------------------------------------------------
    def costs_of(self, assign: Sequence[int]) -> list[Cost]:
        return [b.costs[j] for b, j in zip(self.buckets, assign)]

    def estimate(self, assign: Sequence[int]) -> tuple[float, float]:
        """(estimated iteration time, sum of bucket finishes) of ``assign`` on the Espresso timeline (memoized)."""
        end, total, _, _ = self.run(assign)
        return end, total

    def run(self, assign: Sequence[int]) -> tuple[float, float, list[float], list[tuple]]:
        """The timeline of ``assign`` (:meth:`Timeline.run`), memoized: the search revisits assignments."""
        key = tuple(assign)
        got = self._runs.get(key)
        if got is None:
            got = self._runs[key] = self.timeline.run(self.costs_of(assign))
        return got

    def uniform(self, strategy: str, codec: Codec, rule: Any) -> list[int] | None:
        """One option for every bucket: ``rule`` is ``"default"`` or a partition count (clipped per bucket)."""
        assign = []
        for b in self.buckets:
            ks = [k for (s, c, k) in b.index if s == strategy and c == str(codec)]
            if not ks:
                return None
            if rule == "default":
                k = effective_partitions(BucketChoice(strategy=strategy), self.workers, b.numel)
                if (strategy, str(codec), k) not in b.index:
                    k = min(ks, key=lambda x: abs(x - k))
            else:
                k = max([x for x in ks if x <= rule], default=min(ks))
            assign.append(b.index[(strategy, str(codec), k)])
        return assign

    def hidden(self, b: int, fins: list[float]) -> float | None:
        """Seconds bucket ``b`` finishes before the next gradient is ready, if it hides in that bubble."""
        i = self.timeline.pos[b]
        if i + 1 >= len(self.buckets):
            return None
        nxt = self.buckets[self.timeline.order[i + 1]].ready
        slack = nxt - fins[b]
        return slack if slack >= 0 else None

    # -- search ---------------------------------------------------------------------------------------------
    def isolated_best(self) -> list[int]:
        """Each bucket's best option alone (least isolated makespan; ties: the baseline codec, fewer ops)."""
        return [min(range(len(b.options)), key=lambda j: (b.costs[j].L, j not in b.baseline, b.costs[j].ops))
                for b in self.buckets]

    def greedy(self, assign: list[int], *, skip_hidden: bool, passes: int = 4) -> list[int]:
        """Espresso's greedy: visit buckets by priority, keep the option that lowers the estimate most."""
        assign = list(assign)
        for _ in range(passes):
            changed = False
            for b in self.priority:
                costs = self.costs_of(assign)
                end, total, fins, states = self.run(assign)
                if skip_hidden and self.hidden(b, fins) is not None:
                    continue
                ends, totals = self.timeline.batch(states, b, self.buckets[b].stack, costs)
                best = assign[b]
                for j in np.lexsort((totals, ends))[:1]:
                    if better((float(ends[j]), float(totals[j])), (end, total)):
                        best = int(j)
                if best != assign[b]:
                    assign[b] = best
                    changed = True
            if not changed:
                break
        return assign

    def simplify(self, assign: list[int], strict: bool = False) -> list[int]:
        """Where the baseline codec (no compression) estimates as good, use it: compress only where that gains
        ``min_gain``, or (``strict``) only where leaving a bucket uncompressed would cost anything at all."""
        assign = list(assign)
        for b in self.priority:
            bucket = self.buckets[b]
            if assign[b] in bucket.baseline:
                continue
            costs = self.costs_of(assign)
            end, total, _, states = self.run(assign)
            ends, totals = self.timeline.batch(states, b, bucket.stack, costs)
            base = min(bucket.baseline, key=lambda j: (ends[j], totals[j]))
            if ends[base] <= end + (max(1e-9, 1e-6 * end) if strict else min_gain(end)):
                assign[b] = int(base)
        return assign

    def notes(self, assign: list[int]) -> list[str]:
        """Why each bucket has its option: the predicted gain against the best baseline-codec option.  With all
        gradients ready together, buckets of one size and option share the note of the first of them (the
        rule decides per size; evaluating every bucket's alternatives would cost quadratic time)."""
        costs = self.costs_of(assign)
        end, total, fins, states = self.run(assign)
        out = []
        base_name = str(self.base_codec)
        verb = "compressing" if base_name == "none" else "another codec"
        shared: dict[tuple[int, Option], str] = {}
        for b, bucket in enumerate(self.buckets):
            opt = bucket.options[assign[b]]
            if self.monotone and (bucket.numel, opt) in shared:
                out.append(shared[(bucket.numel, opt)])
                continue
            ends, _ = self.timeline.batch(states, b, bucket.stack, costs)
            others = [j for j in range(len(bucket.options)) if j not in bucket.baseline]
            slack = self.hidden(b, fins)
            if assign[b] in bucket.baseline:
                if slack is not None:
                    out.append(f"hidden in bubble ({slack * 1e3:.1f} ms to spare)")
                elif not others:
                    out.append(f"{base_name}: the only codec candidate")
                else:
                    best = min(others, key=lambda j: ends[j])
                    extra = float(ends[best]) - end
                    if self._small(bucket):
                        out.append(f"small: kept {'uncompressed' if base_name == 'none' else base_name}")
                    elif extra > 5e-5:
                        out.append(f"{base_name}: {verb} adds {extra * 1e3:.1f} ms")
                    elif extra > -min_gain(end):
                        out.append(f"{base_name}: {verb} saves {-extra * 1e3:.2f} ms, less than the "
                                   f"{min_gain(end) * 1e3:.2f} ms that compression must gain")
                    else:
                        out.append(f"{base_name}: {verb} estimates {extra * 1e3:+.1f} ms, but no plan doing so "
                                   "simulated faster by the gain compression must bring")
            else:
                best_base = min(bucket.baseline, key=lambda j: ends[j]) if bucket.baseline else None
                if best_base is None:
                    out.append(f"{opt.codec}: best of the candidates")
                else:
                    gain = float(ends[best_base]) - end
                    note = f"{opt.codec}: {-gain * 1e3:+.1f} ms vs {base_name}"
                    if slack is not None:
                        note += " (hidden in bubble)"
                    elif self.monotone and gain < min_gain(end):
                        note += " by estimate (compressed with every larger bucket: the size rule)"
                    out.append(note)
            shared[(bucket.numel, opt)] = out[-1]
        return out

    def _never_pays(self, bucket: PlanBucket) -> bool:
        """HiPress's selective compression: in isolation, no compressed option beats the best uncompressed."""
        base = min(bucket.costs[j].L for j in bucket.baseline)
        comp = [c.L for j, c in enumerate(bucket.costs) if j not in bucket.baseline]
        return bool(comp) and min(comp) >= base

    def _small(self, bucket: PlanBucket) -> bool:
        return bucket.numel * 4 <= SMALL_BYTES and self._never_pays(bucket)

    def exact_compact(self, assign: Sequence[int]) -> bool:
        """Whether every bucket's option has an exact compact template here (so the plan's compact table
        simulates exactly as the full plan: ``casync.plan.assemble.compact_is_exact``)."""
        return self.symmetric and all(self._exact(b, j) for b, j in zip(self.buckets, assign))

    def ops(self, assign: Sequence[int]) -> int:
        """Ops the simulator runs for ``assign``: its compact tables' where exact, else the full plan's."""
        if self.exact_compact(assign):
            return sum(get_strategy(b.options[j].strategy).compact_op_count(self.workers, b.options[j].partitions)
                       for b, j in zip(self.buckets, assign))
        return sum(b.costs[j].ops for b, j in zip(self.buckets, assign))

    def table(self, assign: Sequence[int], compact: bool | None = None) -> OpTable:
        """The simulator's op table of the plan ``assign`` stands for, glued from per-bucket fragments: each
        distinct (bucket size, option) is expanded once per planning call, however many candidates use it.
        Compact templates (one representative worker) where :meth:`exact_compact` allows, unless
        ``compact=False``; either simulates to the full plan's iteration time."""
        if compact is None:
            compact = self.exact_compact(assign)
        frag = self._compact if compact else self._fragment
        count = len(self.buckets)
        return OpTable.concat([(frag(b, j), b.name, bucket_priority(index, count))
                               for index, (b, j) in enumerate(zip(self.buckets, assign))])

    def _choice(self, bucket: PlanBucket, j: int) -> BucketChoice:
        o = bucket.options[j]
        return BucketChoice(strategy=o.strategy, codec=o.codec, partitions=o.partitions, two_way=self.two_way,
                            servers=None)

    def _fragment(self, bucket: PlanBucket, j: int) -> OpTable:
        return self._table(bucket, j, False)

    def _exact(self, bucket: PlanBucket, j: int) -> bool:
        o = bucket.options[j]
        key = (bucket.numel, o.strategy, str(o.codec), o.partitions)
        exact = self._exact_memo.get(key)
        if exact is None:
            exact = self._exact_memo[key] = compact_is_exact(self.workers, [(bucket.name, bucket.group)],
                                                             [self._choice(bucket, j)])
        return exact

    def _compact(self, bucket: PlanBucket, j: int) -> OpTable:
        """The bucket option's compact fragment (only for options whose template is exact)."""
        return self._table(bucket, j, True)

    def _table(self, bucket: PlanBucket, j: int, compact: bool) -> OpTable:
        """The op table of one bucket option (compact template or full), built once per structure and
        resized for other bucket sizes."""
        o = bucket.options[j]
        key = (bucket.numel, o.strategy, str(o.codec), o.partitions, compact)
        frag = self._tables.get(key)
        if frag is None:
            choice = self._choice(bucket, j)
            parts = tuple(bucket_partitions(choice, self.workers, bucket.numel, compact, bucket.name))
            structure = structure_key(self.workers, self.workers if self.op == "mean" else 1, choice, len(parts),
                                      None, feedback.resolve(o.codec, self.error_feedback), compact)
            base = self._bases.get(structure)
            if base is not None and (parts == base[2] or base[0].resizable):
                template, table, base_parts = base
                frag = table if parts == base_parts else table.resized(*template.sizes(parts))
            else:
                plan = assemble_plan(bucket.group, self.workers, [(bucket.name, bucket.group)], [choice],
                                     error_feedback=self.error_feedback, op=self.op, compact=compact,
                                     templates=self.templates)
                frag = OpTable.from_graph(plan.graph)
                self._bases.setdefault(structure, (self.templates[structure], frag, parts))
            frag.durations(self.profile)
            self._tables[key] = frag
        return frag

    def choices(self, assign: list[int], notes: list[str]) -> list[BucketChoice]:
        return [BucketChoice(strategy=o.strategy, codec=o.codec, partitions=o.partitions,
                                    two_way=self.two_way, servers=None, note=note)
                for o, note in zip((b.options[j] for b, j in zip(self.buckets, assign)), notes)]
