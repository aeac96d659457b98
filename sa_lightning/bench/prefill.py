"""``cli.py bench prefill``: prefill latency and peak memory of a patched Hugging Face model per mode.

    python cli.py bench prefill                 # tiny random Qwen3 on the CPU, n = 1k .. 8k, w = 256
    python cli.py bench prefill --model Qwen/Qwen3-8B --device cuda --dtype bfloat16 --lengths 4096 16384 32768
    python cli.py bench prefill --model smollm2 --lengths 1024 4096   # after `python cli.py fetch smollm2`
    python cli.py bench prefill --model qwen3-8b-random --device cuda --dtype bfloat16 --lengths 4096 32768
    python cli.py bench prefill --model qwen3-8b-random --layers 1 --dtype bfloat16 --lengths 64 128 --window 32

``qwen3-8b-random`` is Qwen3-8B's architecture (Qwen/Qwen3-8B's config.json) with random weights, built
directly in ``--dtype`` on ``--device``: no download, and 15.3 GiB in bf16 on a GPU. ``--layers K`` keeps K
of its 36 layers; one layer still holds the 151,936 x 4,096 embedding and LM head, 1.44B parameters,
2.7 GiB in bf16, which is what a CPU smoke run uses (fp32 would need 5.4 GiB).

Modes run interleaved within each repeat, so their ratios share the machine's state. Memory is the peak
tensor memory of one forward (the CUDA allocator's peak, or the CPU profiler's timeline).
"""
from __future__ import annotations

import argparse
import statistics
import time
from datetime import date
from pathlib import Path

import torch

from ..attention import variant_names
from ..attention.variants import SWA
from ..utils.atomic import add_overwrite, output_folder, replacing_files, write_text
from ..utils.device import check_device
from ..utils.report import head, row
from .machine import available_bytes, describe, positive_int, sync
from .memory import peak_bytes
from ..utils.argtypes import doc_help

#: what a pretrained model runs without training, and the ratios' reference
MODES, REFERENCE = variant_names(gated=False), SWA.name
# Qwen/Qwen3-8B's config.json: 36 layers, GQA 32/8 heads of 128, untied 151,936-token embedding; 8.19B parameters.
QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu", attention_bias=False,
                rope_theta=1_000_000.0, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
                initializer_range=0.02)
RANDOM_MODELS = ("tiny", "qwen3-8b-random")


def tiny_model(layers: int | None = None):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=4096, hidden_size=128, intermediate_size=341, num_hidden_layers=layers or 4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=65536)
    return Qwen3ForCausalLM(cfg).eval()


def qwen3_8b_config(layers: int | None = None):
    from transformers import Qwen3Config

    return Qwen3Config(**{**QWEN3_8B, "num_hidden_layers": layers or QWEN3_8B["num_hidden_layers"]})


def meta_model(cfg, dtype: torch.dtype):
    """A Qwen3ForCausalLM whose parameters are ``dtype`` on the meta device: shapes only, no memory."""
    from transformers import Qwen3ForCausalLM

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            return Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)


def random_model(cfg, device: torch.device, dtype: torch.dtype):
    """Random weights allocated once, in ``dtype`` on ``device`` (never an fp32 copy of 8B parameters on the CPU).

    Checks that the weights fit the device's free memory before allocating them. Matrices get Hugging Face's
    std (``initializer_range``) from a uniform draw, which costs half a normal one on a CPU (latency does not
    depend on the distribution); RMSNorm gains are 1.
    """
    model = meta_model(cfg, dtype)
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    free = available_bytes(device)
    if free is not None and need > 0.9 * free:
        kind = str(dtype).removeprefix("torch.")
        raise ValueError(f"--model qwen3-8b-random with {cfg.num_hidden_layers} layers needs {need / 2**30:.1f} GiB "
                         f"of {kind} weights but {device} has {free / 2**30:.1f} GiB free; use fewer --layers, "
                         f"bfloat16 or a GPU.")
    model.to_empty(device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            bound = cfg.initializer_range * 3**0.5  # U(-b, b) has std b / sqrt(3)
            p.fill_(1.0) if p.dim() == 1 else p.uniform_(-bound, bound)
        for module in model.modules():  # to_empty left RoPE's computed (non-persistent) buffers uninitialised
            if type(module).__name__.endswith("RotaryEmbedding"):
                fresh = type(module)(cfg)
                for name, buf in fresh.named_buffers(recurse=False):
                    getattr(module, name).copy_(buf)
    return model.eval()


def build_model(args, device: torch.device, dtype: torch.dtype):
    if args.model == "qwen3-8b-random":
        return random_model(qwen3_8b_config(args.layers), device, dtype)
    if args.model == "tiny":
        model = tiny_model(args.layers)
    else:
        from ..models.sources import load_causal_lm, resolve

        model = load_causal_lm(resolve(args.model), dtype)
    return model.to(device=device, dtype=dtype)


def run(args) -> list[dict]:
    from ..models.patcher import PatchSpec, patch, unpatch

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    model = build_model(args, device, dtype)
    args.params = sum(p.numel() for p in model.parameters())
    print(f"model {args.model}: {args.params / 1e9:.2f}B parameters, {model.config.num_hidden_layers} layers, "
          f"built in {time.perf_counter() - t0:.1f} s", flush=True)
    specs = {mode: PatchSpec.at_window(mode, args.window) for mode in args.modes}
    rows = []
    for n in args.lengths:
        ids = torch.randint(0, model.config.vocab_size, (args.batch, n), device=device)

        def forward():
            with torch.no_grad():
                model(ids, use_cache=False, logits_to_keep=1)
            sync(device)

        times = {m: [] for m in args.modes}
        for _ in range(args.repeats):
            for mode in args.modes:
                patch(model, specs[mode])
                forward()  # warm-up
                start = time.perf_counter()
                forward()
                times[mode].append(time.perf_counter() - start)
        for mode in args.modes:
            patch(model, specs[mode])
            rows.append({"n": n, "mode": mode, "ms": statistics.median(times[mode]) * 1e3,
                         "peak_mib": peak_bytes(forward, device) / 2**20})
        swa = next(r for r in rows if r["n"] == n and r["mode"] == REFERENCE)
        for r in rows:
            if r["n"] == n:
                r["x_swa"] = r["ms"] / swa["ms"]
        print(" ".join(f"{r['mode']} {r['ms']:.0f}ms ({r['x_swa']:.2f}x swa, {r['peak_mib']:.0f} MiB)"
                       for r in rows if r["n"] == n), f"  n={n}", flush=True)
        unpatch(model)
    return rows


def markdown(rows: list[dict], args) -> str:
    layers = f" ({args.layers} layers)" if args.layers else ""
    lines = [f"# bench prefill ({date.today()}, {describe(torch.device(args.device))}, model {args.model}{layers}, "
             f"{args.params / 1e9:.2f}B parameters, batch {args.batch}, w={args.window}, {args.dtype})", "",
             *head(["n", "mode", "ms", "× SWA", "peak MiB"], ["---:", "---", "---:", "---:", "---:"])]
    lines += [row([r["n"], r["mode"], f"{r['ms']:.1f}", f"{r['x_swa']:.2f}", f"{r['peak_mib']:.1f}"]) for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="cli.py bench prefill", **doc_help(__doc__))
    p.add_argument("--model", default="tiny", help="tiny (a random 4-layer Qwen3), qwen3-8b-random (Qwen3-8B's "
                   "shapes, random weights), a Hub id, a local folder, a .gguf file or smollm2 (fetched)")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="keep this many layers of a random model (tiny, qwen3-8b-random) (default: all of them)")
    p.add_argument("--lengths", type=positive_int, nargs="+", default=[1024, 2048, 4096, 8192],
                   help="prompt lengths n in tokens")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, metavar="MODE",
                   help=f"the modes to time, any of {', '.join(MODES)}")
    p.add_argument("--window", type=positive_int, default=256, help="the window w of the windowed modes")
    p.add_argument("--batch", type=positive_int, default=1, help="prompts per forward pass")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="timed repeats per mode and length, interleaved; the table shows their median")
    p.add_argument("--device", default="cpu", help="where to run (cpu, cuda, cuda:1)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="the weights' dtype")
    p.add_argument("--out", type=output_folder, default="outputs/bench", help="the folder of prefill.md")
    add_overwrite(p)
    args = p.parse_args(argv)
    if args.layers and args.model not in RANDOM_MODELS:
        p.error(f"--layers applies to the random models ({', '.join(RANDOM_MODELS)}), not to {args.model!r}.")
    check_device(args.device)
    if REFERENCE not in args.modes:
        args.modes.insert(0, REFERENCE)  # the ratios' reference
    rows = run(args)
    text = markdown(rows, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with replacing_files(out, "benchmark", args.overwrite) as tmp:  # never a file of the user's own
        write_text(tmp / "prefill.md", text)
    print(text)
    return rows
