"""Does Adam with its variance frozen after a warm-up diverge on the LM, with exact (uncompressed) gradients?
One process, the 4 ranks' batches as one (world=1, batch 8), seed 0, 400 steps, warm-up 40 (10 %).
Variants: adam (plain), frozen (v frozen at step K, rows with v=0 masked: OneBitAdam's rule without compression),
frozen-dense (frozen for every tensor but the input embedding, which keeps Adam's own v)."""
import math, sys, torch
from casync.tasks import get_task
task = get_task("lm"); data = task.load(None)
K, STEPS, LR, B1, B2, EPS = 40, 400, 2e-3, 0.9, 0.999, 1e-8

def run(variant):
    model = task.model(data, 0); torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    batches = task.batches(data, 0, 1, 8, 0)
    frozen = {}
    out = []
    for t in range(1, STEPS + 1):
        x, y = next(batches)
        opt.zero_grad(); task.loss(model, x, y).backward()
        if variant == "adam" or t <= K:
            opt.step()
        else:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    st = opt.state[p]
                    if variant == "frozen-dense" and name == "embedding.weight":
                        st["step"] += 1; s = float(st["step"])
                        st["exp_avg"].mul_(B1).add_(p.grad, alpha=1 - B1)
                        st["exp_avg_sq"].mul_(B2).addcmul_(p.grad, p.grad, value=1 - B2)
                        denom = (st["exp_avg_sq"] / (1 - B2 ** s)).sqrt_().add_(EPS)
                        p.addcdiv_(st["exp_avg"], denom, value=-LR / (1 - B1 ** s))
                        continue
                    if name not in frozen:
                        frozen[name] = st["exp_avg_sq"].clone() / (1 - B2 ** K)
                    v = frozen[name]
                    st["exp_avg"].mul_(B1).add_(p.grad, alpha=1 - B1).masked_fill_(v == 0, 0)
                    p.addcdiv_(st["exp_avg"], v.sqrt().add_(EPS), value=-LR / (1 - B1 ** t))
        if t % 100 == 0:
            out.append((t, round(task.evaluate(model, data), 3)))
    print(variant, out, flush=True)

for v in sys.argv[1:]:
    run(v)
