#!/bin/bash
# Diagnostic on the lent machine: pass speed under contention, onebit hop encode by BLOCK, actor op CPU by BLOCK.
export PYTHONUNBUFFERED=1
REPO=$PWD
{ nproc; lscpu; python3 -c "import numpy; numpy.show_runtime()"; } > $OUT/machine.txt 2>&1
cd /tmp
for P in 1 12; do PYTHONPATH=$REPO timeout 60 python3 $REPO/.devrun/passbench.py $P; done 2>&1 | tee $OUT/pass.txt
{ PYTHONPATH=$REPO timeout 60 python3 $REPO/.devrun/blockbench.py 1600000 1 1 262144 131072 65536 32768 16384
  PYTHONPATH=$REPO timeout 90 python3 $REPO/.devrun/blockbench.py 1600000 3 4 262144 131072 65536 32768 16384; } 2>&1 | tee $OUT/block.txt
mkdir -p /tmp/site && python3 -m zipfile -e $REPO/.devrun/site.zip /tmp/site && chmod -R +x /tmp/site/ray/core || exit 3
for round in 1 2; do for B in 262144 65536; do
  echo "== round $round BLOCK $B" | tee -a $OUT/actor.txt
  CASYNC_BLOCK_EXPERIMENT=$B PYTHONPATH=/tmp/site:$REPO timeout 120 python3 $REPO/benchmarks/actor_op_cpu.py --configs ring/onebit --compute-threads 3 --iters 7 2>>$OUT/err.txt | tee -a $OUT/actor.txt
done; done
