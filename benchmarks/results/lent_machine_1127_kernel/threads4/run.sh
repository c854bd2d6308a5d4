#!/bin/bash
# Lent machine: compute threads 3 vs 4 on one machine (RayEngine, ResNet-50, 4 workers), then 4 emulated nodes
# at 10 Gbit with the better count, head to head against gloo bucketed, DDP's hooks and PowerSGD.
export PYTHONUNBUFFERED=1
REPO=$PWD
mkdir -p /tmp/site && python3 -W ignore -m tarfile -e $REPO/.devrun/site.tar.xz /tmp/site && chmod -R +x /tmp/site/ray/core || exit 3
chmod +x $REPO/.devrun/netkit/bin/* $REPO/.devrun/netkit/real/*
{ nproc; lscpu | grep -E "Model name|L2|L3"; uptime; } > $OUT/machine.txt 2>&1
for round in 1 2; do for T in 3 4; do
  echo "== round $round threads $T"
  (cd /tmp && PYTHONPATH=/tmp/site:$REPO timeout 150 python3 $REPO/benchmarks/actor_op_cpu.py \
     --configs ring/onebit,ps-twoway/randomk:ratio=0.01 --compute-threads $T --iters 7 2>>/tmp/err.txt)
done; done 2>&1 | tee $OUT/threads.txt
T=$(python3 - $OUT/threads.txt <<'PY'
import json, sys, statistics
spans = {}; t = None
for line in open(sys.argv[1]):
    if line.startswith("== "): t = int(line.split()[-1])
    elif line.startswith("{"):
        r = json.loads(line)
        if r["config"] == "ring/onebit": spans.setdefault(t, []).append(r["span_ms"])
print(min(spans, key=lambda k: statistics.median(spans[k])) if spans else 3)
PY
)
echo "netem with compute threads $T" | tee -a $OUT/threads.txt
export PATH=$REPO/.devrun/netkit/bin:$PATH PYTHONPATH=/tmp/site
timeout 330 bash benchmarks/netem/netem.sh run --nodes 4 --rate 10gbit -- --models resnet50 --workers 4 \
  --strategies ring,ps-twoway --codecs onebit,randomk:ratio=0.01 --compute-threads $T \
  --baselines gloo-bucket,ddp,ddp-powersgd-r1 --hooks ring/onebit,ps-twoway/randomk:ratio=0.01 \
  --iters 5 --no-sim --head-to-head 3 --out /tmp/netem_out > $OUT/netem_run.log 2>&1
echo "netem rc $?" >> $OUT/netem_run.log
cp /tmp/netem_out/bench.md /tmp/netem_out/bench.json $OUT/ 2>/dev/null
tail -5 /tmp/err.txt > $OUT/err_tail.txt 2>/dev/null
bash benchmarks/netem/netem.sh down >/dev/null 2>&1 || true
