#!/bin/bash
# Lent machine: the onebit C kernel (built here for cp312, carried): bit-identity and speed against NumPy 2.5,
# then 4 emulated nodes at 10 Gbit, 4 compute threads, head to head; then actor op CPU kernel off/on.
export PYTHONUNBUFFERED=1
REPO=$PWD
mkdir -p /tmp/site && python3 -W ignore -m tarfile -e $REPO/.devrun/site.tar.xz /tmp/site && chmod -R +x /tmp/site/ray/core || exit 3
chmod +x $REPO/.devrun/netkit/bin/* $REPO/.devrun/netkit/real/*
(cd /tmp && PYTHONPATH=$REPO timeout 60 python3 $REPO/.devrun/check2.py) 2>&1 | tee $OUT/kernel.txt
export PATH=$REPO/.devrun/netkit/bin:$PATH PYTHONPATH=/tmp/site
timeout 260 bash benchmarks/netem/netem.sh run --nodes 4 --rate 10gbit -- --models resnet50 --workers 4 \
  --strategies ring,ps-twoway --codecs onebit --compute-threads 4 \
  --baselines gloo-bucket,ddp,ddp-powersgd-r1 --hooks ring/onebit \
  --iters 5 --no-sim --head-to-head 3 --out /tmp/netem_out > $OUT/netem_run.log 2>&1
echo "netem rc $?" >> $OUT/netem_run.log
cp /tmp/netem_out/bench.md /tmp/netem_out/bench.json $OUT/ 2>/dev/null
for K in 0 1; do
  echo "== CASYNC_SIGN_KERNEL=$K threads 4"
  (cd /tmp && CASYNC_SIGN_KERNEL=$K PYTHONPATH=/tmp/site:$REPO timeout 70 python3 $REPO/benchmarks/actor_op_cpu.py \
     --configs ring/onebit --compute-threads 4 --iters 7 2>/dev/null)
done 2>&1 | tee $OUT/threads.txt
