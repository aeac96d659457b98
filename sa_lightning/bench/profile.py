"""``cli.py bench profile``: where each variant's time goes, part by part, beside SWA's.

Two things are profiled with ``torch.profiler``, forward and backward:
- **layer**: one attention call at Table 2's layout (``bench attention``'s case: q, k, v and a fresh draw per
  call, made before the clock starts);
- **step**: one whole training step of a model (``bench train``'s case: the tiny model on the CPU, the 360M model
  at seq 2048 on a GPU), its per-layer draws included.
Each op's self time (the device's on CUDA, the host's on a CPU) is summed into a part by its name: the draw (σ or
the hash seeds), the loss, the gathers and scatters (SA's reorders and their backward, and the band kernels' own
scatter-adds), the attention kernels, the matrix products (projections, MLP, logits), the optimizer and the rest.
A part's name patterns are in ``PARTS``; an op matches the first part whose pattern it contains. Within a step on a
CPU, a batched product (``bmm``) counts as attention and a 2-D one (``mm``, ``addmm``) as a matrix product: the
model's linear layers run as 2-D products and the banded kernels as batched ones. On CUDA the parts are matched on
kernel names, where cuBLAS's batched products carry no "bmm" and count as matmul, and the draws (made on the host)
add no device time: a GPU profile's parts are read with the costliest kernels listed under them. Writes
``profile_<preset>.md``: the parts in ms per call with each variant's ratio to SWA's same part, then each
variant's costliest ops.
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from datetime import date
from pathlib import Path

import torch

from ..attention import VARIANTS, trained_variant_names, variant_label
from ..attention.variants import SA, SA_SWA, SWA
from ..utils.atomic import add_overwrite, output_folder, replacing_files, write_text
from ..utils.report import head, number, row
from .machine import apply_preset, describe, positive_int, sync
from ..utils.argtypes import doc_help, preset_help

PRESETS = {
    "cpu": dict(device="cpu", batch=1, heads=4, kv_heads=4, dim=64, window=256, n=8192, dtype="float32",
                model="tiny", seq_len=256, step_batch=16, step_window=32, repeats=3, warmup=1),
    "paper": dict(device="cuda", batch=16, heads=16, kv_heads=16, dim=64, window=256, n=8192, dtype="bfloat16",
                  model="360m", seq_len=2048, step_batch=8, step_window=256, repeats=5, warmup=3),
}
#: (part, substrings of a lower-cased op or kernel name); the first match wins, "other" takes the rest
PARTS = (
    ("draw", ("randperm", "argsort", "randint", "uniform_", "random_", "bernoulli")),
    ("loss", ("log_softmax", "logsoftmax", "nll_loss", "cross_entropy")),  # CUDA: cunn_SoftMax...LogSoftMax...
    ("gather/scatter", ("index_select", "indexselect", "gather", "scatter", "index_add", "index_copy", "index_put",
                 "take_along", "indexing_backward", "index_elementwise")),
    ("attention", ("attention", "flash", "flex", "fmha", "softmax", "logsumexp", "bmm", "tem_fused")),
    ("matmul", ("addmm", "aten::mm", "gemm", "xmma", "cutlass", "nvjet", "sgemm", "matmul")),
    ("optimizer", ("adam", "_foreach", "multi_tensor")),
)
PART_NAMES = tuple(name for name, _ in PARTS) + ("other",)


def part_of(name: str) -> str:
    """The part an op or kernel name belongs to (``PARTS``)."""
    low = name.lower()
    return next((part for part, keys in PARTS if any(k in low for k in keys)), "other")


def profile_calls(fn, calls: int, device: torch.device) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """(ms per call of each part, the ops by self time in ms per call) over ``calls`` calls of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    from .memory import quiet_profiler

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with quiet_profiler(), profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        sync(device)
    ops: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():
        us = evt.self_device_time_total if cuda else evt.self_cpu_time_total
        if us > 0 and (not cuda or evt.device_type.name == "CUDA" or "cuda" in str(evt.device_type).lower()):
            ops[evt.key] += us / 1e3 / calls
    parts = dict.fromkeys(PART_NAMES, 0.0)
    for name, ms in ops.items():
        parts[part_of(name)] += ms
    return parts, sorted(ops.items(), key=lambda kv: -kv[1])


def layer_case(variant: str, args, device: torch.device):
    """``bench attention``'s case at one length: a call is forward and backward with a fresh draw."""
    from .attention import Case

    shim = argparse.Namespace(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, dim=args.dim,
                              window=args.window, moba_top_k=2, backend="auto", forward_only=False)
    case = Case(variant, args.n, shim, device, getattr(torch, args.dtype))
    total = args.warmup + args.repeats

    def call():
        if not case.pairs:
            case.draw(total)
        case()

    return call


def step_case_of(variant: str, args, device: torch.device):
    """``bench train``'s ``StepCase`` at this command's step settings (the model, the window, the batch)."""
    from .train import StepCase

    shim = argparse.Namespace(model=args.model, layers=args.layers, window=args.step_window, seq_len=args.seq_len,
                              moba_block_size=max(1, args.step_window // 2), batch=args.step_batch,
                              dtype=args.dtype)
    return StepCase(variant, shim, device)


def step_case(variant: str, args, device: torch.device):
    """``bench train``'s case: a call is one training step (forward, backward, optimizer) with its draws."""
    return step_case_of(variant, args, device).step


def reorder_bytes(variant: str, args, device: torch.device) -> dict[str, dict]:
    """What the token reorders move per layer in one training step (forward and backward), counted by the reorders
    themselves (``attention.permutation.counting_moves``): as the model runs the variant ("model": a layer in slot
    order where the variant has one, ``attention.slots``) and with the kernels reordering q, k, v and the output
    ("kernels")."""
    from dataclasses import replace as swap

    from ..attention import get_variant
    from ..attention.permutation import counting_moves

    case = step_case_of(variant, args, device)
    found = {}
    for how in ("model", "kernels"):
        if how == "kernels":
            plain = swap(get_variant(variant), slot_kernel=None)
            for block in case.model.blocks:
                block.attn.variant = plain
        with counting_moves() as moved:
            case.step()
        sync(device)
        found[how] = {k: v / case.cfg.n_layer for k, v in moved.items()}
    return found


def run(args) -> dict[str, dict]:
    """{"layer"/"step": {variant: (parts, ops)}, "moves": {variant: reorder_bytes}}."""
    device = torch.device(args.device)
    results: dict[str, dict] = {}
    for what in args.what:
        results[what] = {}
        if what == "moves":
            for variant in args.variants:
                results[what][variant] = found = reorder_bytes(variant, args, device)
                print(f"moves {variant_label(variant)}: {found['model']['data'] / 2**20:.1f} MiB per layer "
                      f"({found['kernels']['data'] / 2**20:.1f} with the kernels' reorders)", flush=True)
            continue
        fns = {v: (layer_case if what == "layer" else step_case)(v, args, device) for v in args.variants}
        for fn in fns.values():  # every variant warmed up before any is profiled, so none pays the first calls
            for _ in range(args.warmup):
                fn()
        for variant, fn in fns.items():
            results[what][variant] = profile_calls(fn, args.repeats, device)
            total = sum(results[what][variant][0].values())
            print(f"{what} {variant_label(variant)}: {total:.1f} ms per call", flush=True)
    return results


def part_table(found: dict[str, tuple[dict, list]]) -> list[str]:
    """Parts x variants: ms per call, and each part's ratio to SWA's same part."""
    names = list(found)
    lines = head(["part", *[f"{variant_label(v)} ms" for v in names],
                  *[f"{variant_label(v)} ÷ SWA" for v in names if v != SWA.name and SWA.name in found]],
                 ["---", *["---:"] * (len(names) + sum(v != SWA.name and SWA.name in found for v in names))])
    totals = {v: sum(p.values()) for v, (p, _) in found.items()}
    for part in (*PART_NAMES, "total"):
        ms = {v: (totals[v] if part == "total" else found[v][0][part]) for v in names}
        ratios = []
        if SWA.name in found:
            base = ms[SWA.name]
            ratios = [number(ms[v] / base, ".2f") if base > 0.005 else "–" for v in names if v != SWA.name]
        lines.append(row([f"**{part}**" if part == "total" else part, *[number(ms[v], ".2f") for v in names],
                          *ratios]))
    return lines


def moves_table(found: dict[str, dict], args) -> list[str]:
    """Bytes the token reorders move per layer, as the model runs each variant and with the kernels reordering."""
    layers = f", {args.layers} layers" if args.layers else ""
    lines = [f"## What the token reorders move per layer\n\nOne training step (forward and backward) of model "
             f"{args.model}{layers}, B = {args.step_batch}, seq {args.seq_len}, w = {args.step_window}, {args.dtype}: "
             "the bytes every reorder of tokens reads and writes (its data; its index apart), counted by the reorders "
             "themselves. \"As run\": a variant with a slot path runs the layer in slot order (`attention.slots`); "
             "\"kernels\": q, k, v and the output reordered by the kernel. A banded kernel's own window gathers (the "
             "CPU's SA) are not reorders and count 0.\n",
             *head(["variant", "copies as run", "MiB as run", "index MiB", "copies, kernels", "MiB, kernels",
                    "as run ÷ kernels"], ["---", "---:", "---:", "---:", "---:", "---:", "---:"])]
    for variant, f in found.items():
        now, before = f["model"], f["kernels"]
        lines.append(row([variant_label(variant), number(now["copies"], ".0f"), number(now["data"] / 2**20, ".1f"),
                          number(now["index"] / 2**20, ".2f"), number(before["copies"], ".0f"),
                          number(before["data"] / 2**20, ".1f"),
                          number(now["data"] / before["data"], ".2f") if before["data"] else "–"]))
    return lines + [""]


def markdown(results, args) -> str:
    device = torch.device(args.device)
    text = [f"# Where the time goes: `bench profile --preset {args.preset}`\n",
            f"{describe(device)}, {date.today()}. torch.profiler over {args.repeats} calls after {args.warmup} "
            f"warm-up calls; each op's self time ({'the device' if device.type == 'cuda' else 'the host'}), "
            "summed into parts by name (`bench/profile.py`, PARTS), in ms per call.\n"]
    for what, found in results.items():
        if what == "moves":
            text += moves_table(found, args)
            continue
        if what == "layer":
            text.append(f"## One attention call, forward and backward\n\nB = {args.batch}, H = {args.heads} "
                        f"(kv {args.kv_heads}), d = {args.dim}, n = {args.n}, w = {args.window}, {args.dtype}; "
                        "a fresh draw per call, made before the profile.\n")
        else:
            layers = f", {args.layers} layers" if args.layers else ""
            text.append(f"## One training step, forward, backward and optimizer\n\nModel {args.model}{layers}, "
                        f"B = {args.step_batch}, seq {args.seq_len}, w = {args.step_window}, {args.dtype}; the "
                        "per-layer draws inside the step.\n")
        text += part_table(found)
        text.append("")
        for variant, (_, ops) in found.items():
            top = ", ".join(f"`{name}` {ms:.2f}" for name, ms in ops[:args.top])
            text.append(f"- {variant_label(variant)}, costliest ops (ms per call): {top}")
        text.append("")
    return "\n".join(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py bench profile", **doc_help(__doc__))
    p.add_argument("--preset", choices=PRESETS, default="cpu",
                   help="the sizes below at once: cpu (on a CPU) or paper (Table 2's layer and the 360M model's step, "
                        "on a GPU); a flag given wins over its preset")
    p.add_argument("--what", nargs="+", choices=["layer", "step", "moves"], default=["layer", "step", "moves"],
                   help="layer: one attention call; step: one training step; moves: the bytes the token reorders "
                        "move per layer in a step (default: all three)")
    p.add_argument("--variants", nargs="+", default=[SWA.name, SA.name, SA_SWA.name], choices=sorted(VARIANTS),
                   metavar="VARIANT", help=f"the variants to profile, any of {', '.join(sorted(VARIANTS))}")
    for key, text in (("batch", "the layer's batch"), ("heads", "the layer's query heads"),
                      ("kv_heads", "the layer's key and value heads"), ("dim", "the layer's head dimension"),
                      ("window", "the layer's window w"), ("n", "the layer's sequence length"),
                      ("seq_len", "the step's tokens per sequence"), ("step_batch", "the step's sequences"),
                      ("step_window", "the step's window w"), ("repeats", "profiled calls per case"),
                      ("warmup", "unprofiled calls per case before them")):
        p.add_argument(f"--{key.replace('_', '-')}", dest=key, type=positive_int, default=None,
                       help=preset_help(text, PRESETS, key))
    p.add_argument("--layers", type=positive_int, default=None,
                   help="keep this many of the step's model's layers (default: all of them)")
    p.add_argument("--model", choices=["tiny", "360m"], default=None,
                   help=preset_help("the step's model", PRESETS, "model"))
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help=preset_help("the tensors' dtype", PRESETS, "dtype"))
    p.add_argument("--top", type=positive_int, default=6, help="ops listed per variant")
    p.add_argument("--out", type=output_folder, default="outputs/bench",
                   help="the folder of the markdown table (profile_<preset>.md)")
    add_overwrite(p)
    return p


def main(argv: list[str] | None = None):
    args = build_parser().parse_args(argv)
    apply_preset(args, PRESETS)
    if "step" in args.what or "moves" in args.what:
        untrainable = [v for v in args.variants if v not in trained_variant_names()]
        if untrainable:
            raise SystemExit(f"error: a training step needs a variant a model trains with; {', '.join(untrainable)} "
                             "is training-free: profile it with --what layer.")
    results = run(args)
    text = markdown(results, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with replacing_files(out, "benchmark", args.overwrite) as tmp:  # never a file of the user's own
        write_text(tmp / f"profile_{args.preset}.md", text)
    print(text)
    return results
