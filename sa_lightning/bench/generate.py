"""``cli.py bench generate``: greedy generation tokens/s of the Transformer++, with and without the KV cache.

    python cli.py bench generate                                   # tiny and 360m shapes, random weights, CPU
    python cli.py bench generate --shapes 360m --device cuda --dtype bfloat16 --prompt 1024 --new 128

With the cache (``SATransformerForCausalLM``), the prompt is prefilled once and each new token reads the
cache; without it, every step recomputes the whole sequence through the variant (what evaluation's
``generate_until`` did before). Both run interleaved within each repeat, so their ratio shares the machine's
state. Random weights: the cost of a step does not depend on what the weights say.
"""
from __future__ import annotations

import argparse
import statistics
import time
from datetime import date
from pathlib import Path

import torch

from ..attention import VARIANTS
from ..attention.variants import SA_SWA
from ..utils.atomic import add_overwrite, output_folder, replacing_files, write_text
from ..utils.device import check_device
from ..utils.report import head, row
from .machine import describe, positive_int, sync
from ..utils.argtypes import doc_help


SHAPES = ("tiny", "360m")


def _model(shape: str, variant: str, dtype: torch.dtype, device: torch.device):
    from ..models import ModelConfig, Transformer
    from ..models.hf_model import SATransformerForCausalLM

    torch.manual_seed(0)
    net = Transformer(ModelConfig.from_name(shape, variant=variant, backend="auto")).to(device, dtype)
    return SATransformerForCausalLM.from_transformer(net.eval()).eval()


@torch.no_grad()
def _tokens_per_s(model, prompt: torch.Tensor, new: int, cache: bool) -> float:
    sync(prompt.device)
    start = time.perf_counter()
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new,
                   do_sample=False, use_cache=cache, pad_token_id=0, eos_token_id=None)
    sync(prompt.device)
    return new / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="cli.py bench generate", **doc_help(__doc__))
    p.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES),
                   help="the model shapes to time (random weights)")
    p.add_argument("--variant", default=SA_SWA.name, choices=list(VARIANTS),
                   help="the attention variant (default: the paper's gated SA+SWA)")
    p.add_argument("--prompt", type=positive_int, default=128, help="prompt tokens")
    p.add_argument("--new", type=positive_int, default=16, help="generated tokens")
    p.add_argument("--repeats", type=positive_int, default=2,
                   help="timed repeats of each case, interleaved; the table shows their median")
    p.add_argument("--device", default="cpu", help="where to run (cpu, cuda, cuda:1)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="the weights' dtype")
    p.add_argument("--out", type=output_folder, default="outputs/bench_generate", help="the folder of generate.md")
    add_overwrite(p)
    args = p.parse_args(argv)
    device, dtype = check_device(args.device), getattr(torch, args.dtype)
    rows = []
    for shape in args.shapes:
        model = _model(shape, args.variant, dtype, device)
        limit = model.config.max_position_embeddings
        if args.prompt + args.new > limit:
            raise ValueError(f"--prompt {args.prompt} + --new {args.new} exceeds the {shape} model's max_seq_len={limit}.")
        prompt = torch.randint(1, model.config.vocab_size, (1, args.prompt),
                               generator=torch.Generator().manual_seed(0)).to(device)
        _tokens_per_s(model, prompt, 2, True)  # warm-up
        timings = {True: [], False: []}
        for _ in range(args.repeats):
            for cache in (True, False):
                timings[cache].append(_tokens_per_s(model, prompt, args.new, cache))
        cached, recomputed = statistics.median(timings[True]), statistics.median(timings[False])
        rows.append({"shape": shape, "params_M": round(model.model.num_parameters() / 1e6, 1), "cached": cached,
                     "recomputed": recomputed, "speedup": cached / recomputed})
        print(f"{shape}: {cached:.1f} tokens/s with the cache, {recomputed:.1f} without ({cached / recomputed:.1f}x)",
              flush=True)
        del model
    lines = [f"Greedy generation, {args.variant}, prompt {args.prompt} + {args.new} new tokens, {args.dtype}, "
             f"{describe(device)}, {date.today()}, median of {args.repeats}.", "",
             *head(["shape", "params (M)", "tokens/s, KV cache", "tokens/s, recomputed", "cache speed-up"],
                   ["---", "---:", "---:", "---:", "---:"])]
    lines += [row([r["shape"], r["params_M"], f"{r['cached']:.1f}", f"{r['recomputed']:.1f}",
                   f"{r['speedup']:.1f}x"]) for r in rows]
    out = Path(args.out)
    with replacing_files(out, "benchmark", args.overwrite) as tmp:  # never a file of the user's own
        write_text(tmp / "generate.md", "\n".join(lines) + "\n")
    print(f"wrote {out / 'generate.md'}", flush=True)
    return rows
