#!/bin/bash
# Lent machine, 16th session: the hook at 10 Gbit after the 15th session's GIL/GC/step-thread work.
# 1. kernel + wire tests on this machine's NumPy; 2. 4 emulated nodes at 10 Gbit, 4 compute threads, ring/onebit
# on RayEngine, hooks ring/onebit and ps-twoway/onebit, DDP's floor, 5 head-to-head rounds (the hook's too).
export PYTHONUNBUFFERED=1
REPO=$PWD
date -u +%T > $OUT/times.txt
mkdir -p /tmp/site && python3 -W ignore -m tarfile -e $REPO/.devrun/site.tar.xz /tmp/site && chmod -R +x /tmp/site/ray/core || exit 3
chmod +x $REPO/.devrun/netkit/bin/* $REPO/.devrun/netkit/real/*
date -u +%T >> $OUT/times.txt
(cd $REPO && PYTHONPATH=$REPO timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
   tests/primitives/test_sign_kernel.py tests/primitives/test_wire.py 2>&1 | tail -4; \
   python3 -c "import numpy, sys; print('numpy', numpy.__version__, sys.version.split()[0]); import primitives.codecs._sign_sweep as k; print('kernel', k.available(), k.GIL_FREE_MIN)"; nproc; lscpu | grep -i "model name") > $OUT/kernel_tests.txt 2>&1
date -u +%T >> $OUT/times.txt
export PATH=$REPO/.devrun/netkit/bin:$PATH PYTHONPATH=/tmp/site
timeout ${NETEM_S:-400} bash benchmarks/netem/netem.sh run --nodes 4 --rate 10gbit -- --models resnet50 --workers 4 \
  --strategies ring --codecs onebit --compute-threads 4 \
  --baselines gloo-bucket,ddp,ddp-nocomm,ddp-powersgd-r1 --hooks ring/onebit,ps-twoway/onebit \
  --iters 5 --no-sim --head-to-head ${H2H:-5} --out /tmp/netem_out > $OUT/netem_run.log 2>&1
echo "netem rc $?" >> $OUT/netem_run.log
date -u +%T >> $OUT/times.txt
cp /tmp/netem_out/bench.md /tmp/netem_out/bench.json $OUT/ 2>/dev/null
