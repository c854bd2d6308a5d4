# before (a11b600, "$BASE", its kernel built) and after ("$MAIN"), alternating: the hook rows, one machine
set -u
for round in 1 2; do
for which in base main; do
  if [ $which = base ]; then root="$BASE"; else root="$MAIN"; fi
  cd $root
  PYTHONPATH=$root timeout 900 python -m casync bench --models resnet50 --workers 4 --strategies ring --codecs onebit --baselines ddp,ddp-nocomm,ddp-powersgd-r1 --hooks ring/onebit,ps-twoway/onebit --iters 8 --no-sim --no-progress --out "$OUT"/abh_${which}_$round > "$OUT"/abh_${which}_$round.log 2>&1
  echo "== $which round $round"; grep -E "^\| (torch DDP|DDP)" "$OUT"/abh_${which}_$round/bench.md | cut -d'|' -f2-8
done; done
