"""Does Adam with its variance frozen after a warm-up diverge on the LM, with exact (uncompressed) gradients, and
does a task of another size (vocabulary, embedding width, tokens per step) or a variance refresh change that?
One process, the ranks' batches as one (world=1), seeded; no compression, so what it shows is the frozen variance's.
Variants: adam (plain), frozen (v frozen at step K, rows with v=0 masked: OneBitAdam's rule without compression),
frozen-dense (frozen for every tensor but the input embedding, which keeps Adam's own v), frozen-embedding (frozen
for the input embedding only, every other tensor on Adam's own v: what a plan that compresses only the embedding
and syncs the rest exactly could do), refresh (0/1 Adam's
variance schedule, Lu et al. 2022 / DeepSpeed's ZeroOneAdam: v updated with the gradient only at steps t with
t % interval == 0, the interval starting at 1 and doubling after every --kappa updates; m every step; --warmup
ignored; Adam's bias corrections, the variance's over its own updates).
    python benchmarks/probes/lm_frozen_variance.py [--vocab 16384 --embed 512 --batch 8 --warmup 40 --steps 400
        --lr 2e-3 --seed 0 --every 100] adam frozen ...
Answers: benchmarks/results/time_to_accuracy/lm_compressed_adam/README.md and lm_task_resize/."""
import argparse, json, time, torch
from casync.datasets.pycorpus import load_corpus
from casync.tasks import get_task, lm

ap = argparse.ArgumentParser()
ap.add_argument("variants", nargs="+", choices=["adam", "frozen", "frozen-dense", "frozen-embedding", "refresh"])
ap.add_argument("--vocab", type=int, default=lm.VOCAB); ap.add_argument("--embed", type=int, default=lm.EMBED)
ap.add_argument("--batch", type=int, default=8); ap.add_argument("--warmup", type=int, default=40)
ap.add_argument("--steps", type=int, default=400); ap.add_argument("--lr", type=float, default=2e-3)
ap.add_argument("--seed", type=int, default=0); ap.add_argument("--kappa", type=int, default=16); ap.add_argument("--every", type=int, default=100)
args = ap.parse_args()
task = get_task("lm"); data = load_corpus(None, vocab_size=args.vocab)
K, B1, B2, EPS = args.warmup, 0.9, 0.999, 1e-8

def run(variant):
    model = lm.make_model(len(data.vocab), args.embed, lm.WIDTH, args.seed); torch.manual_seed(args.seed)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
    batches = task.batches(data, 0, 1, args.batch, args.seed)
    frozen, out, start = {}, [], time.time()
    interval, counter, updates = 1, 0, 0  # refresh's schedule
    for t in range(1, args.steps + 1):
        x, y = next(batches)
        opt.zero_grad(); task.loss(model, x, y).backward()
        if variant == "refresh":
            refresh = t % interval == 0
            if refresh:
                updates += 1; counter += 1
                if counter == args.kappa:
                    counter, interval = 0, interval * 2
            with torch.no_grad():
                for p in model.parameters():
                    st = opt.state.setdefault(p, {})
                    if not st:
                        st["exp_avg"], st["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                    st["exp_avg"].mul_(B1).add_(p.grad, alpha=1 - B1)
                    if refresh:
                        st["exp_avg_sq"].mul_(B2).addcmul_(p.grad, p.grad, value=1 - B2)
                    denom = (st["exp_avg_sq"] / (1 - B2 ** updates)).sqrt_().add_(EPS)
                    p.addcdiv_(st["exp_avg"], denom, value=-args.lr / (1 - B1 ** t))
        elif variant == "adam" or t <= K:
            opt.step()
        else:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    st = opt.state[p]
                    own = {"frozen": False, "frozen-dense": name == "embedding.weight",
                           "frozen-embedding": name != "embedding.weight"}[variant]  # Adam's own v
                    if own:
                        st["step"] += 1; s = float(st["step"])
                        st["exp_avg"].mul_(B1).add_(p.grad, alpha=1 - B1)
                        st["exp_avg_sq"].mul_(B2).addcmul_(p.grad, p.grad, value=1 - B2)
                        denom = (st["exp_avg_sq"] / (1 - B2 ** s)).sqrt_().add_(EPS)
                        p.addcdiv_(st["exp_avg"], denom, value=-args.lr / (1 - B1 ** s))
                        continue
                    if name not in frozen:
                        frozen[name] = st["exp_avg_sq"].clone() / (1 - B2 ** K)
                    v = frozen[name]
                    st["exp_avg"].mul_(B1).add_(p.grad, alpha=1 - B1).masked_fill_(v == 0, 0)
                    p.addcdiv_(st["exp_avg"], v.sqrt().add_(EPS), value=-args.lr / (1 - B1 ** t))
        if t % args.every == 0:
            out.append((t, round(task.evaluate(model, data), 3)))
            print(variant, out[-1], flush=True)
    print(json.dumps({"variant": variant, **{k: v for k, v in vars(args).items() if k != "variants"},
                      "loss": out, "seconds": round(time.time() - start)}), flush=True)

for v in args.variants:
    run(v)
