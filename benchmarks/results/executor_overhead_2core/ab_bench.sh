# before (343d8d1, "$BASE") and after ("$MAIN"), alternating: one machine, ResNet-50, 4 workers
# BASE: a checkout of 343d8d1 with its kernel built (python setup.py build_ext --inplace); MAIN: this one; OUT: where the runs go
set -u
for round in 1 2; do
for which in base main; do
  if [ $which = base ]; then root="$BASE"; else root="$MAIN"; fi
  cd $root
  PYTHONPATH=$root timeout 900 python -m casync bench --models resnet50 --workers 4 --strategies ring,ps-twoway --codecs onebit --baselines gloo-bucket,ddp,ddp-powersgd-r1 --hooks ring/onebit --iters 8 --no-sim --no-progress --out "$OUT"/ab_${which}_$round > "$OUT"/ab_${which}_$round.log 2>&1
  echo "== $which round $round"; grep -E "^\| (torch|DDP|casync)" "$OUT"/ab_${which}_$round/bench.md | cut -d'|' -f2-8
done; done
