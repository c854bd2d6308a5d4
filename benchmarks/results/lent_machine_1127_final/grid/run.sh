#!/bin/bash
# Lent machine, 13th session: the final onebit kernel (server merges and all-gathers through it too).
# 1. the kernel tests on this machine's NumPy; 2. 4 emulated nodes at 10 Gbit, 4 compute threads,
# ring / ps-twoway / allgather onebit, two hook rows, 5 head-to-head rounds (the hook's too).
export PYTHONUNBUFFERED=1
REPO=$PWD
date -u +%T > $OUT/times.txt
mkdir -p /tmp/site && python3 -W ignore -m tarfile -e $REPO/.devrun/site.tar.xz /tmp/site && chmod -R +x /tmp/site/ray/core || exit 3
chmod +x $REPO/.devrun/netkit/bin/* $REPO/.devrun/netkit/real/*
date -u +%T >> $OUT/times.txt
(PYTHONPATH=$REPO:$REPO/.devrun/pyt timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
   tests/primitives/test_sign_kernel.py 2>&1 | tail -5; python3 -c "import numpy; print('numpy', numpy.__version__)") > $OUT/kernel_tests.txt 2>&1
date -u +%T >> $OUT/times.txt
export PATH=$REPO/.devrun/netkit/bin:$PATH PYTHONPATH=/tmp/site
timeout 430 bash benchmarks/netem/netem.sh run --nodes 4 --rate 10gbit -- --models resnet50 --workers 4 \
  --strategies ring,ps-twoway,allgather --codecs onebit --compute-threads 4 \
  --baselines gloo-bucket,ddp,ddp-powersgd-r1 --hooks ring/onebit,allgather/onebit \
  --iters 5 --no-sim --head-to-head 5 --out /tmp/netem_out > $OUT/netem_run.log 2>&1
echo "netem rc $?" >> $OUT/netem_run.log
date -u +%T >> $OUT/times.txt
cp /tmp/netem_out/bench.md /tmp/netem_out/bench.json $OUT/ 2>/dev/null
