"""``cli.py bench train``: training step time, tokens/s, MFU and peak memory of every variant, and the data pipeline's speed.

The model is the tiny config's Transformer++ (or ``--preset paper``: the 360M model at seq 2048 on a
GPU). Variants step interleaved within each repeat, so their ratios share the machine's state. The
data pipeline (tokenize + pack the embedded corpus, then read blocks) is timed in the same run, so
its tokens/s can be compared with what training consumes.

``--compile both`` times each variant eager and under ``torch.compile`` side by side: the compiled
case wraps the same model (same weights and optimizer, so memory holds one copy per variant), and
its compile happens in the ``--warmup`` steps, which are never timed. Compiled training is timed on
CUDA only; on the CPU its rows are listed as skipped (see ``CPU_COMPILE_NOTE``).

MFU is achieved FLOP/s (tokens/s x ``models.flops.train_flops_per_token``) over the device's peak
FLOP/s for the dtype (``machine.peak_flops``), "–" where the peak is unknown (CPUs). Peak memory is
what training the variant alone needs: its weights, optimizer state and batch, plus the peak a step
allocates above them (``memory.peak_bytes``: the CUDA allocator's peak, or the CPU profiler's).

The paper preset's batch is 8 (16,384 tokens a step): every variant's model and AdamW state stay
live for the interleaving (about 4.3 GB each in fp32), and a step's bf16 activations and logits take
about 1.5 MiB per token (``memory.peak_bytes`` of 1- and 2-layer 360M models on a CPU, scaled to 24
layers), so 5 variants at B=8 need about 45 GiB and B=16 about 70 GiB, too close to an 80 GB GPU's limit.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

from ..attention import trained_variant_names, variant_label
from ..attention.variants import SWA
from ..models import ModelConfig, Transformer
from ..models.flops import matmul_params, train_flops_per_token
from .machine import apply_preset, describe, peak_flops, positive_int, sync
from .memory import peak_bytes
from ..utils.atomic import add_overwrite, output_folder, replacing_files, write_text
from ..utils.report import head, number, row
from ..utils.argtypes import doc_help, preset_help

PRESETS = {
    "cpu": dict(model="tiny", seq_len=256, batch=16, window=32, moba_block_size=16, steps=4, repeats=3, warmup=2,
                device="cpu", dtype="float32"),
    "paper": dict(model="360m", seq_len=2048, batch=8, window=256, moba_block_size=128, steps=5, repeats=3, warmup=3,
                  device="cuda", dtype="bfloat16"),
}
COMPILE_MODES = {"off": (False,), "on": (True,), "both": (False, True)}
COMPILED_DEVICES = ("cuda",)  # where compiled training is timed; elsewhere its rows carry CPU_COMPILE_NOTE
# Measured on this project's 2-core CPU with torch 2.13: Inductor took 10-30 s per variant to compile a
# training step, longer than the whole benchmark. (Its C++ for the banded kernels' masks also failed to build
# until the model kept its banded kernels out of the compiled graph: ``models.transformer._attend_eagerly``.)
CPU_COMPILE_NOTE = ("skipped: compiled training is timed on CUDA only (on the CPU, Inductor's compile of a "
                    "training step outlasts the benchmark)")


class StepCase:
    """One variant: a model, an optimizer and a fixed batch; each call is one full training step."""

    def __init__(self, variant: str, args, device: torch.device):
        layers = {"n_layer": args.layers} if args.layers else {}
        self.cfg = ModelConfig.from_name(args.model, variant=variant, window=args.window, max_seq_len=args.seq_len,
                                         block_size=args.moba_block_size, **layers)
        torch.manual_seed(0)
        self.model = Transformer(self.cfg).to(device)
        self.forward = self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=device.type == "cuda")
        self.batch = torch.randint(0, self.cfg.vocab_size, (args.batch, args.seq_len + 1), device=device)
        self.device, self.dtype, self.step_index = device, getattr(torch, args.dtype), 0

    def compiled_twin(self) -> "StepCase":
        """The same model, weights and optimizer, stepped through what LitLM's in-place ``net.compile()`` builds
        (``Transformer.compile``); a shallow copy shares the modules and parameters, so one copy per variant
        stays in memory and the eager case stays uncompiled."""
        twin = object.__new__(StepCase)
        twin.__dict__.update(self.__dict__)
        twin.forward = copy.copy(self.model)
        twin.forward.compile()
        return twin

    def state_bytes(self) -> int:
        """Bytes that live between steps: weights, optimizer state and the batch (gradients are freed each step)."""
        tensors = {id(p): p for p in self.model.parameters()}
        tensors.update((id(t), t) for st in self.opt.state.values() for t in st.values() if torch.is_tensor(t))
        tensors[id(self.batch)] = self.batch
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def step(self) -> None:
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            logits = self.forward(self.batch[:, :-1], perm_stream=self.step_index)
        loss = F.cross_entropy(logits.float().flatten(0, 1), self.batch[:, 1:].flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step_index += 1

    def timed(self, steps: int) -> float:
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        sync(self.device)
        return (time.perf_counter() - t0) / steps


def data_pipeline_tokens_per_second(seq_len: int, batch: int) -> tuple[float, float]:
    """(tokenize+pack, read packed blocks) tokens/s on the embedded corpus, from a cold cache."""
    from torch.utils.data import DataLoader

    from ..data import BlockSampler, PackedBlocks, SourceConfig, load_tokenizer, prepare_tokens

    tok = load_tokenizer("embedded")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folder = prepare_tokens(SourceConfig("embedded", split="train"), tok, "embedded", tmp, progress=False)
        pack = PackedBlocks(folder, seq_len).meta["num_tokens"] / (time.perf_counter() - t0)
        blocks = PackedBlocks(folder, seq_len)
        t0 = time.perf_counter()
        n = sum(b[:, 1:].numel() for b in DataLoader(blocks, batch_size=batch, sampler=BlockSampler(len(blocks))))
        read = n / (time.perf_counter() - t0)
    return pack, read


def build_cases(args, device: torch.device) -> dict[tuple[str, bool], StepCase | None]:
    """One case per (variant, compiled); None marks a compiled case this device skips."""
    cases = {}
    for v in args.variants:
        eager = StepCase(v, args, device)
        for compiled in COMPILE_MODES[args.compile]:
            if compiled and device.type not in COMPILED_DEVICES:
                cases[(v, True)] = None
            else:
                cases[(v, compiled)] = eager.compiled_twin() if compiled else eager
    return cases


def _label(key: tuple[str, bool]) -> str:
    return f"{variant_label(key[0])}{' compiled' if key[1] else ''}"


def time_cases(cases: dict, args) -> dict[tuple[str, bool], list[float]]:
    """Warm every case up (allocator, kernels, compiles), then time them interleaved, ``repeats`` times."""
    live = {k: c for k, c in cases.items() if c is not None}
    for key, case in live.items():
        print(f"warm-up {_label(key)}: {args.warmup} steps{' (compiling)' if key[1] else ''} ...", end=" ", flush=True)
        t0 = time.perf_counter()
        case.timed(args.warmup)
        print(f"{time.perf_counter() - t0:.1f} s", flush=True)
    times: dict[tuple[str, bool], list[float]] = {k: [] for k in live}
    for r in range(args.repeats):
        for key, case in live.items():
            times[key].append(case.timed(args.steps))
        print(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{_label(k)} {t[-1] * 1e3:.0f} ms" for k, t in times.items()),
              flush=True)
    return times


def measure_row(key: tuple[str, bool], case: StepCase, seconds: list[float], args, peak: float | None) -> dict:
    """tokens/s, MFU (from ``train_flops_per_token``) and peak memory of one timed case."""
    sec = statistics.median(seconds)
    tokens_per_s = args.batch * args.seq_len / sec
    flops = train_flops_per_token(case.cfg, args.seq_len, matmul_params(case.model))
    step_peak = peak_bytes(case.step, case.device)
    return {"variant": key[0], "compile": key[1], "step_ms": sec * 1e3, "tokens_per_s": tokens_per_s,
            "params_M": case.model.num_parameters() / 1e6, "flops_per_token": flops,
            "mfu": tokens_per_s * flops / peak if peak else float("nan"),
            "peak_mib": (case.state_bytes() + step_peak) / 2**20, "note": ""}


def skipped_row(key: tuple[str, bool]) -> dict:
    nan = float("nan")
    return {"variant": key[0], "compile": key[1], "step_ms": nan, "tokens_per_s": nan, "params_M": nan,
            "flops_per_token": nan, "mfu": nan, "peak_mib": nan, "note": CPU_COMPILE_NOTE}


def add_ratios(rows: list[dict]) -> None:
    """``vs_swa``: step time over SWA's with the same compile setting; ``vs_eager``: over the same variant's eager step."""
    ms = {(r["variant"], r["compile"]): r["step_ms"] for r in rows}
    nan = float("nan")
    for r in rows:
        r["vs_swa"] = r["step_ms"] / ms.get((SWA.name, r["compile"]), nan)
        r["vs_eager"] = r["step_ms"] / ms.get((r["variant"], False), nan)


def run(args) -> tuple[list[dict], dict]:
    device = torch.device(args.device)
    peak = peak_flops(device, getattr(torch, args.dtype))
    cases = build_cases(args, device)
    # Variants share code objects (the attention functions), so each adds guards to the same frames: a
    # compiled run of every variant needs more recompiles than dynamo's default before it falls back to eager.
    limit = getattr(torch._dynamo.config, "recompile_limit", None)  # cache_size_limit before torch 2.6
    with torch._dynamo.config.patch(recompile_limit=max(64, limit)) if limit else contextlib.nullcontext():
        times = time_cases(cases, args)
        rows = [skipped_row(k) if c is None else measure_row(k, c, times[k], args, peak) for k, c in cases.items()]
    add_ratios(rows)
    pack, read = data_pipeline_tokens_per_second(args.seq_len, args.batch) if args.data else (float("nan"),) * 2
    speeds = [r["tokens_per_s"] for r in rows if r["tokens_per_s"] == r["tokens_per_s"]]
    data = {"pack_tokens_per_s": pack, "read_tokens_per_s": read, "pack_vs_fastest_training": pack / max(speeds),
            "pack_vs_slowest_training": pack / min(speeds), "peak_flops": peak}
    return rows, data


def markdown(rows, data, args) -> str:
    peak = data.get("peak_flops")
    intro = (f"Training step, {args.preset} preset: model {args.model}"
             f"{f' ({args.layers} layers)' if args.layers else ''}, B={args.batch}, seq {args.seq_len}, "
             f"w={args.window}, {args.dtype}, {describe(args.device)}, "
             f"{date.today()}; median of {args.repeats} interleaved repeats of {args.steps} steps after "
             f"{args.warmup} warm-up steps per case. MFU: tokens/s x training FLOPs/token (models/flops.py) over "
             f"{f'the device peak of {peak / 1e12:.1f} TFLOP/s' if peak else 'the device peak, unknown here'}; "
             f"peak MiB: weights + optimizer state + batch + a step's peak allocation.\n\n")
    lines = head(["variant", "compile", "params (M)", "step (ms)", "tokens/s", "× SWA", "MFU", "peak MiB"],
                 ["---", "---", *["---:"] * 6])
    lines += [row([r["variant"], r["compile"], number(r["params_M"], ".2f"), number(r["step_ms"], ".0f"),
                   number(r["tokens_per_s"], ",.0f"), number(r["vs_swa"], ".2f"),
                   number(r["mfu"] * 100, ".1f") + ("%" if r["mfu"] == r["mfu"] else ""),
                   number(r["peak_mib"], ",.0f")])
              for r in rows]
    notes = sorted({r["note"] for r in rows if r["note"]})
    tail = "".join(f"\n\nCompiled rows {n}." for n in notes)
    if data["pack_tokens_per_s"] == data["pack_tokens_per_s"]:
        tail += (f"\n\nData pipeline (embedded corpus, cold cache): tokenize+pack {data['pack_tokens_per_s']:,.0f} tokens/s, "
                 f"read packed blocks {data['read_tokens_per_s']:,.0f} tokens/s; tokenize+pack is "
                 f"{data['pack_vs_fastest_training']:.0f}× the fastest variant's training tokens/s.")
    return intro + "\n".join(lines) + tail + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py bench train", **doc_help(__doc__))
    p.add_argument("--preset", choices=PRESETS, default="cpu",
                   help="the sizes below at once: cpu (the tiny model on a CPU) or paper (the 360M model at seq 2048 "
                        "on a GPU); a flag given wins over its preset")
    trained = trained_variant_names()  # asked when the command runs: a variant registered since import is in
    p.add_argument("--variants", nargs="+", default=list(trained), choices=trained, metavar="VARIANT",
                   help=f"the variants to time, any of {', '.join(trained)} (default: all of them)")
    for key, text in (("seq_len", "tokens per sequence"), ("batch", "sequences per step"),
                      ("window", "the window w of the windowed variants"), ("moba_block_size", "MoBA's block size"),
                      ("steps", "training steps per timed repeat"),
                      ("repeats", "timed repeats per variant, interleaved; the table shows their median"),
                      ("warmup", "untimed steps per case before the repeats (a compiled case compiles in them)")):
        p.add_argument(f"--{key.replace('_', '-')}", dest=key, type=positive_int, default=None,
                       help=preset_help(text, PRESETS, key))
    p.add_argument("--layers", type=positive_int, default=None,
                   help="keep this many of the model's layers (default: all of the preset's model's)")
    p.add_argument("--compile", choices=COMPILE_MODES, default="off",
                   help="time each variant eager (off), under torch.compile (on), or both side by side")
    p.add_argument("--no-data", dest="data", action="store_false", help="skip the data pipeline timing")
    p.add_argument("--out", type=output_folder, default="outputs/bench",
                   help="the folder of the markdown table (train_<preset>.md)")
    add_overwrite(p)
    return p


def main(argv: list[str] | None = None):
    args = build_parser().parse_args(argv)
    apply_preset(args, PRESETS)
    if args.compile == "on" and torch.device(args.device).type not in COMPILED_DEVICES:
        raise SystemExit("error: --compile on times compiled training on CUDA only; on the CPU use --compile off, "
                         "or --compile both to list the compiled rows as skipped.")
    rows, data = run(args)
    text = markdown(rows, data, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with replacing_files(out, "benchmark", args.overwrite) as tmp:  # never a file of the user's own
        write_text(tmp / f"train_{args.preset}.md", text)
    print(text)
    return rows, data
