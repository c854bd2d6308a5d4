"""Probe: does OneBitAdam on the LM survive a longer warm-up, another strategy, or top-k for its momentum?
(seed 0, 400 steps, 4 gloo ranks on one machine; answers in benchmarks/results/time_to_accuracy/lm_compressed_adam/)

    python benchmarks/probes/lm_onebit_adam_variants.py warmups OUT   # warm-up 25 % and 50 %; allgather at 10 %
    python benchmarks/probes/lm_onebit_adam_variants.py topk OUT      # top-k 1 % momentum, two-way PS and allgather
"""
import sys

from casync.bench.setup import local_setup
from casync.bench.tta import configs as registry
from casync.bench.tta.configs import Config
from casync.bench.tta.report import write_report
from casync.bench.tta.runner import run_tta
from casync.tasks import get_task


def adam(name: str, **options) -> Config:
    base = {"strategy": "ps", "two_way": True, "codec": "onebit", "warmup_steps": "10%"}
    return Config(name, "casync optimizer", f"OneBitAdam {options}", optimizer="OneBitAdam",
                  options={**base, **options}, tasks=("lm",))


SETS = {
    "warmups": [adam("onebit-adam-w25", warmup_steps="25%"), adam("onebit-adam-w50", warmup_steps="50%"),
                adam("onebit-adam-allgather", strategy="allgather", two_way=False)],
    "topk": [adam("adam-topk-ps", codec="topk:ratio=0.01"),
             adam("adam-topk-allgather", codec="topk:ratio=0.01", strategy="allgather", two_way=False)],
}

if __name__ == "__main__":
    which, out = sys.argv[1], sys.argv[2]
    configs = SETS[which]
    for config in configs:
        registry.CONFIGS[config.name] = config
    result = run_tta(get_task("lm"), configs, seeds=[0], steps=400, ranks=4, eval_every=100, setup=local_setup(),
                     target=4.892, progress=False,
                     command=f"python benchmarks/probes/lm_onebit_adam_variants.py {which} {out}")
    write_report(result, out)
    for run in result["runs"]:
        print(run["config"], [(p["step"], p["metric"]) for p in run["points"]], run.get("error"))
