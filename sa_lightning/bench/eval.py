"""``cli.py bench eval``: how long the offline tasks take, and how much ``eval_samples`` steadies SA's scores.

    python cli.py bench eval --ckpt runs/tiny_sa/tb/version_0/checkpoints/last.ckpt

1. Wall time of the three offline tasks (all documents) for the checkpoint, as ``cli.py evaluate`` runs them.
2. Permutation noise: the last-word requests are scored under ``--seeds`` permutation seeds for each K in
   ``--samples``. Reported per K: the standard deviation over seeds of a request's log-likelihood
   (averaged over requests), of the task's mean log-likelihood, and of its accuracy, with the ratio
   to K=1. Independent draws would give 1/sqrt(K).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import date
from pathlib import Path

import torch

from ..utils.atomic import add_overwrite, output_folder, replacing_files, write_text
from ..utils.report import head, row
from .machine import describe, positive_int
from ..utils.argtypes import doc_help


def _lastword_requests(lm, count: int) -> list:
    from ..eval.offline import DATA_DIR

    reqs = []
    with open(DATA_DIR / "shakespeare_lastword.jsonl", encoding="utf-8") as f:
        for line in list(f)[:count]:
            text = json.loads(line)["text"]
            context, word = text.rsplit(" ", 1)
            ctx, cont = lm._encode_pair(context, " " + word)
            reqs.append(((context, " " + word), ctx, cont))
    return reqs


def noise(model, tokenizer, samples: list[int], seeds: int, count: int, batch_size: int) -> list[dict]:
    from ..eval.lm import SALM

    rows = []
    base_request_std = None
    requests = _lastword_requests(SALM(model, tokenizer), count)  # read and tokenized once for every K and seed
    for k in samples:
        scores = []  # (seeds, requests)
        greedy = []
        for seed in range(seeds):
            lm = SALM(model, tokenizer, batch_size=batch_size, eval_samples=k, seed=seed)
            out = lm._loglikelihood_tokens(requests, disable_tqdm=True)
            scores.append([s for s, _ in out])
            greedy.append(statistics.fmean(float(g) for _, g in out))
        t = torch.tensor(scores, dtype=torch.float64)
        request_std = float(t.std(dim=0).mean())
        base_request_std = base_request_std or request_std
        rows.append({"eval_samples": k, "request_ll_std": request_std, "mean_ll_std": float(t.mean(1).std()),
                     "acc_std": statistics.stdev(greedy), "mean_ll": float(t.mean()),
                     "ratio_to_k1": request_std / base_request_std, "ideal": 1 / k ** 0.5})
        print(f"eval_samples={k}: request ll std {request_std:.4f} ({request_std / base_request_std:.2f}x K=1, "
              f"ideal {1 / k ** 0.5:.2f}x)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="cli.py bench eval", **doc_help(__doc__))
    p.add_argument("--ckpt", required=True, help="a checkpoint written by `cli.py fit`")
    p.add_argument("--samples", type=positive_int, nargs="+", default=[1, 2, 4, 8],
                   help="the eval_samples K to compare (draws averaged per score)")
    p.add_argument("--seeds", type=positive_int, default=8, help="permutation seeds each K is scored under")
    p.add_argument("--requests", type=positive_int, default=100, help="last-word requests scored per seed")
    p.add_argument("--batch_size", type=positive_int, default=32, help="requests scored per forward pass")
    p.add_argument("--skip_timing", action="store_true", help="skip the offline tasks' wall time (part 1)")
    p.add_argument("--out", type=output_folder, default="outputs/bench", help="the folder of eval.md")
    add_overwrite(p)
    args = p.parse_args(argv)  # before the imports below: --help and a bad flag answer at once
    from ..data.tokenizer import load_tokenizer
    from ..eval.harness import run_tasks
    from ..eval.lm import SALM
    from ..models.checkpoint import load_checkpoint

    model, info = load_checkpoint(args.ckpt)
    tokenizer = load_tokenizer(info["tokenizer"])
    lines = [f"# bench eval ({date.today()}, {describe(torch.device('cpu'))})", "",
             f"checkpoint: {args.ckpt} ({info['arch']['attention']['variant']}, w={info['arch']['attention']['window']})", ""]
    if not args.skip_timing:
        start = time.perf_counter()
        results = run_tasks(SALM(model, tokenizer, batch_size=args.batch_size), ["offline"])
        seconds = time.perf_counter() - start
        print(f"offline tasks, all documents: {seconds:.1f}s", flush=True)
        lines += [f"offline tasks (all documents, eval_samples=1): **{seconds:.1f} s**", "",
                  "```", json.dumps(results, indent=1), "```", ""]
    if model.variant.draws:
        rows = noise(model, tokenizer, args.samples, args.seeds, args.requests, args.batch_size)
        lines += [f"permutation noise over {args.seeds} seeds, {args.requests} last-word requests:", "",
                  *head(["eval_samples K", "request ll std", "×K=1", "1/√K", "mean ll std", "acc std", "mean ll"])]
        lines += [row([r["eval_samples"], f"{r['request_ll_std']:.4f}", f"{r['ratio_to_k1']:.2f}", f"{r['ideal']:.2f}",
                       f"{r['mean_ll_std']:.4f}", f"{r['acc_std']:.4f}", f"{r['mean_ll']:.3f}"]) for r in rows]
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with replacing_files(out, "benchmark", args.overwrite) as tmp:  # never a file of the user's own
        write_text(tmp / "eval.md", text)
    print(text)
    return lines
