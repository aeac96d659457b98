"""``cli.py evaluate``: zero-shot results for one or more checkpoints, as JSON, a markdown table in the
paper's layout and TensorBoard scalars.

    python cli.py evaluate --ckpt runs/tiny/tb/version_0/checkpoints/last.ckpt --tasks offline
    python cli.py evaluate --ckpt full.ckpt swa.ckpt sa.ckpt sa_swa.ckpt --tasks table1   # Table 1
    python cli.py evaluate --ckpt sa.ckpt --seeds 0 1 2 3 4 --eval_samples 4   # permutation variance
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from .harness import layout_for, run_tasks
from .table import markdown_table
from ..utils.argtypes import non_negative_int, positive_int, seed
from ..utils.atomic import output_folder, replacing_files, write_text
from ..attention import variant_label


def label_of(info: dict) -> str:
    """A checkpoint's row name from its ``arch``: ``SA+SWA (w=32)``, ``MoBA (c=64, k=2)``, ``Full``."""
    attention = info["arch"]["attention"]
    return variant_label(attention["variant"], attention.get("window"), attention.get("block_size"),
                         attention.get("top_k"), attention.get("sink", 0))


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if labels.count(label) == 1 else f"{label} #{seen[label]}")
    return out


def summarize(per_seed: list[dict[str, dict[str, float]]]) -> tuple[dict, dict]:
    """Mean and (sample) standard deviation over seeds of every metric."""
    mean, std = {}, {}
    for task in per_seed[0]:
        mean[task], std[task] = {}, {}
        for metric in per_seed[0][task]:
            values = [run[task][metric] for run in per_seed if metric in run.get(task, {})]
            mean[task][metric] = statistics.fmean(values)
            std[task][metric] = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, std


def log_tensorboard(folder: Path, metrics: dict[str, dict[str, float]], step: int = 0) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from .harness import scalars

    with SummaryWriter(str(folder)) as writer:
        for tag, value in scalars(metrics).items():
            writer.add_scalar(tag, value, step)


def evaluate(args: argparse.Namespace) -> dict:
    from ..models.checkpoint import load_checkpoint
    from .harness import load_tasks, resolve_tasks
    from .lm import SALM

    loaded = [load_checkpoint(path) for path in args.ckpt]  # a bad checkpoint fails first, in a second
    tasks = resolve_tasks(args.tasks)
    load_tasks(tasks)  # every dataset is at hand before any checkpoint is scored
    labels = _unique(args.label or [label_of(info) for _, info in loaded])
    if len(labels) != len(loaded):
        raise ValueError(f"--label got {len(labels)} names for {len(loaded)} checkpoints; give one per --ckpt.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"tasks": tasks, "limit": args.limit, "eval_samples": args.eval_samples, "sa_mode": args.sa_mode,
              "seeds": args.seeds, "models": {}}
    means, stds = {}, {}
    for (model, info), label in zip(loaded, labels):
        per_seed = []
        for sigma_seed in args.seeds:
            start = time.perf_counter()
            lm = SALM(model, tokenizer=args.tokenizer or info["tokenizer"], batch_size=args.batch_size,
                      device=args.device, eval_samples=args.eval_samples, sa_mode=args.sa_mode, seed=sigma_seed)
            per_seed.append(run_tasks(lm, tasks, limit=args.limit, bootstrap_iters=args.bootstrap_iters, seed=sigma_seed))
            print(f"[{label}] seed {sigma_seed}: done in {time.perf_counter() - start:.1f}s", flush=True)
        means[label], stds[label] = summarize(per_seed)
        report["models"][label] = {"checkpoint": info["path"], "step": info["step"], "arch": info["arch"],
                                   "per_seed": per_seed, "mean": means[label], "std": stds[label]}
        log_tensorboard(out / "tb" / label.replace(" ", "_").replace("/", "_"), means[label], step=info["step"] or 0)
    columns = layout_for(next(iter(means.values())))
    table = markdown_table(means, columns)
    text = f"Zero-shot, tasks: {', '.join(tasks)}; limit={args.limit}; eval_samples={args.eval_samples}; " \
           f"sa_mode={args.sa_mode}; seeds={args.seeds}\n\n{table}"
    if len(args.seeds) > 1:
        text += f"\nStandard deviation over the {len(args.seeds)} permutation seeds:\n\n" + \
            markdown_table(stds, columns).replace("**", "").replace("<u>", "").replace("</u>", "")
    with replacing_files(out, "evaluation") as tmp:  # both, or the previous two whole
        write_text(tmp / "results.json", json.dumps(report, indent=2))
        write_text(tmp / "table.md", text)
    print(text)
    print(f"wrote {out / 'results.json'}, {out / 'table.md'} and TensorBoard logs in {out / 'tb'}")
    return report


def task_limit(text: str) -> int | float:
    """An argparse type for ``--limit``: a whole number of documents (>= 1), or a fraction of each task in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of documents or a fraction below 1, got {text!r}") from None
    if not value > 0 or (value >= 1 and not value.is_integer()):
        raise argparse.ArgumentTypeError(f"must be a whole number of documents (>= 1) or a fraction of each task "
                                         f"in (0, 1), got {text}")
    return int(value) if value >= 1 else value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py evaluate", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--ckpt", nargs="+", required=True, help="checkpoints written by `cli.py fit`")
    p.add_argument("--label", nargs="+", help="row names, one per checkpoint (default: variant and window)")
    p.add_argument("--tasks", nargs="+", default=["offline"],
                   help="task names, or the sets `table1` (the paper's) and `offline` (shipped; the default)")
    p.add_argument("--limit", type=task_limit, default=None, help="documents per task (an int, or a fraction < 1)")
    p.add_argument("--batch_size", type=positive_int, default=32)
    p.add_argument("--eval_samples", type=positive_int, default=1, help="permutation draws averaged per score (SA)")
    p.add_argument("--sa_mode", choices=("stochastic", "deterministic"), default="stochastic")
    p.add_argument("--seeds", type=seed, nargs="+", default=[0], help="permutation seeds; >1 also reports the std")
    p.add_argument("--tokenizer", default=None, help="override the checkpoint's tokenizer")
    p.add_argument("--device", default=None)
    p.add_argument("--bootstrap_iters", type=non_negative_int, default=0,
                   help="lm-eval's stderr bootstrap (0: off, fast)")
    p.add_argument("--out", type=output_folder, default="outputs/eval")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.device is not None:
        from ..utils.device import check_device

        check_device(args.device)
    return evaluate(args)
