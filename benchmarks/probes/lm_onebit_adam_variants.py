"""Probe: OneBitAdam on the LM with longer warm-ups and another strategy (seed 0, 400 steps, one machine)."""
import sys
from casync.bench.setup import local_setup
from casync.bench.tta import configs as reg
from casync.bench.tta.configs import Config
from casync.bench.tta.runner import run_tta
from casync.bench.tta.report import write_report
from casync.tasks import get_task

def adam(name, **opts):
    base = {"strategy": "ps", "two_way": True, "codec": "onebit", "warmup_steps": "10%"}
    return Config(name, "casync optimizer", f"OneBitAdam {opts}", optimizer="OneBitAdam", options={**base, **opts},
                  tasks=("lm",))
configs = [adam("onebit-adam-w25", warmup_steps="25%"), adam("onebit-adam-w50", warmup_steps="50%"),
           adam("onebit-adam-allgather", strategy="allgather", two_way=False)]
for c in configs:
    reg.CONFIGS[c.name] = c
out = sys.argv[1]
result = run_tta(get_task("lm"), configs, seeds=[0], steps=400, ranks=4, eval_every=100, setup=local_setup(),
                 target=4.892, progress=False, command="python benchmarks/probes/lm_onebit_adam_variants.py " + out)
write_report(result, out)
for r in result["runs"]:
    print(r["config"], [(p["step"], p["metric"]) for p in r["points"]], r.get("error"))
