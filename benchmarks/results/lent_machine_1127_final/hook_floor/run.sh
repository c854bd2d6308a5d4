#!/bin/bash
# Lent machine, 13th session, second call: the DDP + casync hook at 10 Gbit beside DDP's no-communication floor,
# 4 head-to-head rounds (ring/onebit on RayEngine against gloo/PowerSGD; the fastest hook against DDP's hooks).
export PYTHONUNBUFFERED=1
REPO=$PWD
date -u +%T > $OUT/times.txt
mkdir -p /tmp/site && python3 -W ignore -m tarfile -e $REPO/.devrun/site.tar.xz /tmp/site && chmod -R +x /tmp/site/ray/core || exit 3
chmod +x $REPO/.devrun/netkit/bin/* $REPO/.devrun/netkit/real/*
date -u +%T >> $OUT/times.txt
export PATH=$REPO/.devrun/netkit/bin:$PATH PYTHONPATH=/tmp/site
timeout 370 bash benchmarks/netem/netem.sh run --nodes 4 --rate 10gbit -- --models resnet50 --workers 4 \
  --strategies ring --codecs onebit --compute-threads 4 \
  --baselines gloo-bucket,ddp,ddp-nocomm,ddp-powersgd-r1 --hooks ring/onebit,ps-twoway/onebit \
  --iters 5 --no-sim --head-to-head 4 --out /tmp/netem_out > $OUT/netem_run.log 2>&1
echo "netem rc $?" >> $OUT/netem_run.log
date -u +%T >> $OUT/times.txt
cp /tmp/netem_out/bench.md /tmp/netem_out/bench.json $OUT/ 2>/dev/null
