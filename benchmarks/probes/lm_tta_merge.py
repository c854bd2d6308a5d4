"""One report from `casync tta` pieces run one seed at a time (same task, steps and configurations): the runs
concatenated, the target, summary rows and sync share recomputed over all seeds as one run of `casync tta` would,
then written as tta.md / tta.json / plots.  Each piece's command, commit and load stay in its own JSON (`pieces`).
    python benchmarks/probes/lm_tta_merge.py OUT PIECE/tta.json ...
Answer: benchmarks/results/time_to_accuracy/lm_exact_variance/."""
import json, sys
from pathlib import Path
from casync.bench.tta.configs import CONFIGS, REFERENCE
from casync.bench.tta.curves import reference_target, summarize, sync_share, target_step
from casync.bench.tta.report import write_report

out, paths = sys.argv[1], sys.argv[2:]
pieces = [json.loads(Path(p).read_text()) for p in paths]
first = pieces[0]
for p in pieces[1:]:
    for key in ("task", "configs"):
        if json.dumps({k: v for k, v in p[key].items() if k != "manifest"}, sort_keys=True) != \
                json.dumps({k: v for k, v in first[key].items() if k != "manifest"}, sort_keys=True):
            raise SystemExit(f"{key} differs between {paths[0]} and a later piece: not one comparison")
    if p["protocol"]["steps"] != first["protocol"]["steps"]:
        raise SystemExit("the pieces ran different step counts")
runs = [r for p in pieces for r in p["runs"]]
steps, better = first["protocol"]["steps"], first["task"]["higher_is_better"]
seeds = sorted({r["seed"] for r in runs})
target = reference_target([r for r in runs if r["config"] == REFERENCE], target_step(steps))
configs = [CONFIGS[name] for name in first["configs"]]
rows = summarize(runs, configs, target, steps, better)
merged = {**first, "command": " ; ".join(p["command"] for p in pieces),
          "commit": ", ".join(sorted({p["commit"] for p in pieces})),
          "protocol": {**first["protocol"], "seeds": seeds},
          "target": {"value": target, "source": f"{REFERENCE}'s metric at step {target_step(steps)} (80 % of {steps}), "
                     f"mean over {len(seeds)} seed(s), merged from {len(pieces)} pieces"},
          "runs": runs, "summary": rows, "sync_share": sync_share(rows),
          "seconds": sum(p["seconds"] for p in pieces),
          "pieces": [{k: p[k] for k in ("command", "commit", "machine", "seconds")} for p in pieces]}
write_report(merged, out)
print(Path(out, "tta.md").read_text())
