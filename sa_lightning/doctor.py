"""``cli.py doctor``: one command that checks every GPU path and writes one report, stage by stage.

    python cli.py doctor --out outputs/doctor          # on one CUDA GPU: within 10 minutes (one sitting)
    python cli.py doctor --tiny --out outputs/doctor   # the same stages at toy sizes on the CPU

A lent GPU comes for a short while, so the check is one prepared command. Its stages run in order, each
in a process of its own with a time budget of its own (a stage past its budget is killed, and the
report says so), and each writes its part of ``DIR/report.md`` and ``DIR/report.json`` as soon as it
ends: a run cut short still leaves every finished stage. Each stage's full output is in
``DIR/stages/<stage>.log``.

The default stages are one GPU sitting: they add up to 460 s, inside the 8 minutes a lent GPU's
one call is given, and each keeps what it measured when it is cut at its budget (a stage writes its rows as
they come, and a killed stage's report shows them).

1. ``env``: torch, CUDA, the device, its memory, and the versions of lightning and transformers.
2. ``tests``: the ``gpu``-marked tests (the compiled hash mask of the random control first), then every
   variant on the device's backends in float32 and bfloat16, forward and backward, against the float64 oracle.
3. ``table2``: ``bench attention --preset paper`` at 8k, 32k, 16k and 2k (in that order, one process per
   length): SDPA's flash kernel (full), SWA, SA, bucketed SA, gated SA+SWA and the random control, forward and
   backward, the median of three repeats; each one's cost against SWA's and full attention's, beside the
   paper's A100 figures.
4. ``train``: the 360M model's compiled training step (bf16-mixed, seq 2048, w = 256), one variant after
   another (SWA, SA, bucketed SA, full, SA+SWA): tokens/s, MFU (``models/flops.py``) and peak memory; a variant
   not reached within the budget is said.
5. ``profile``: ``bench profile --preset paper --what layer moves``: where SWA's, SA's and bucketed SA's time
   goes, and the bytes their token reorders move per layer of the 360M model's training step.

Two more stages run when named (``--stages recompiles prefill``): ``recompiles`` (10 compiled training steps of
6 of the 360M model's layers with a fresh sigma per layer and step: dynamo's graphs, recompiles and graph breaks,
and whether FlexAttention fell back to its unfused path) and ``prefill`` (a random-weight model of Qwen3-8B's
shapes patched with each mode: prefill latency at 8k tokens). Two more make the ensembles' sitting (issue 64,
``--stages env seeds decide``, 460 s): ``seeds`` (``bench seeds --preset gpu``: training seeds a minute of the
pass-key cell, each alone against K = 1 to 256 as one ensemble) and ``decide`` (``study long-range --preset
decide-l4-gpu``: the deciding test at 128 training seeds per compared arm in ensembles; a stage cut at its budget
keeps its finished cells, and the same command continues them).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from datetime import date
from pathlib import Path

from .utils.atomic import add_overwrite, check_own_files, output_folder, replacing_files, write_text
from .utils.checkout import checkout_root
from .utils.report import head, number, row
from .utils.argtypes import doc_help

STAGES = ("env", "tests", "table2", "train", "profile", "recompiles", "prefill", "seeds", "decide")
SITTING = STAGES[:5]  # the default: one GPU sitting
#: seconds per stage: the GPU run fits in one 10-minute sitting (560 s), the CPU's --tiny run in 3 minutes
#: (the H100's first run, 2026-11-24, at larger sizes: env 4, tests 109, recompiles 35 with a warm cache,
#: table2 > 230 for five lengths, train 104, prefill 121; the H200, 2026-11-26: tests 134, a cold compile of
#: the 24-layer model > 60, of one training variant 51)
#: The H100's one sitting, 2026-11-27, at these sizes: env 5, recompiles 57, train 74; tests past 140 (pytest's 13
#: gpu tests alone took 65 s), table2 past 140 and 170 (8k and 16k took about 65 s each, one process per length),
#: prefill past 120 (the 8k row whole, 16k not): hence table2 at 8k and 32k, prefill at 8k.
#: The sitting. The H200's, 2026-11-28, at 470 s: env 5, profile 32; tests cut at 70 (pytest's 40 s reached
#: 3 flex tests, about 10 s of compile each), table2 cut at 150 after 8k and 16k (about 70 s per length), train cut
#: at 180 after SWA (a cold compile of the whole 360M stack took 75-79 s per variant; the blocks now compile one by
#: one). Hence 32k before 16k, and more for Table 2 than for the compiled step.
#: The ensembles' sitting (issue 64), ``--stages env seeds decide``: 10 + 150 + 300 = 460 s, never run on a GPU yet.
BUDGETS = {"gpu": {"env": 10, "tests": 60, "table2": 180, "train": 150, "profile": 60, "recompiles": 60,
                   "prefill": 75, "seeds": 150, "decide": 300},
           "tiny": {"env": 20, "tests": 60, "table2": 40, "train": 60, "profile": 40, "recompiles": 90,
                    "prefill": 40, "seeds": 60, "decide": 90}}
#: Table 2 of the paper (A100 80GB, B=16, H=16, d=64, bf16, forward+backward): n -> (SA w=256 ms, full ms)
PAPER_TABLE2 = {2048: (5.4, 8.0), 4096: (7.9, 27.2), 8192: (15.2, 99.7), 16384: (29.6, 379.9), 32768: (52.8, 1477.0)}
#: the gpu tests run first: FlexAttention's compiled masks, the random control's hash among them
FIRST_GPU_TESTS = "test_attention_flex.py"
#: the gpu tests' share of the tests stage (the H100, 2026-11-27: 13 tests in 65 s, the FSDP and 8B prefill last)
PYTEST_BUDGET_S = 40
ROOT = checkout_root()  # a checkout: tests/ lives here; None for an installed copy, which ships no tests


# ---- the command: stages in child processes, the report after each --------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py doctor", **doc_help(__doc__))
    p.add_argument("--out", type=output_folder, default=Path("outputs/doctor"),
                   help="the sitting's folder: report.md, report.json and stages/<stage>.log")
    add_overwrite(p)
    p.add_argument("--tiny", action="store_true", help="toy sizes on the CPU (what CI runs)")
    p.add_argument("--stages", nargs="+", choices=STAGES, default=list(SITTING),
                   help=f"the stages to run, in order, of {' '.join(STAGES)} (default: {' '.join(SITTING)}, one GPU "
                        "sitting)")
    p.add_argument("--budget_scale", type=float, default=1.0, help="multiply every stage's time budget")
    p.add_argument("--budget", action="append", default=[], metavar="STAGE=SECONDS",
                   help="one stage's time budget, e.g. --budget train=600 (repeatable)")
    p.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # a child process: run this stage only
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.budget_scale <= 0:
        raise SystemExit(f"error: --budget_scale must be > 0, got {args.budget_scale}.")
    if args.stage:
        return run_stage(args.stage, args.out, args.tiny)
    if not args.tiny:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("error: doctor checks the GPU paths and this machine has no CUDA GPU that PyTorch can use; "
                             "run it on the GPU machine, or pass --tiny to run the same stages at toy sizes on the CPU.")
    scale = args.budget_scale
    if args.tiny:
        from .utils.load import user_chose_threads

        if not user_chose_threads():  # toy sizes gain little from threads and lose much on a busy machine
            os.environ["OMP_NUM_THREADS"] = "1"
        slow = machine_slowdown()
        scale *= slow
        if slow >= 1.1:
            print(f"This machine runs {slow:.1f}x slower than the --tiny budgets assume (a timed warm-up and the "
                  f"load average): budgets x{scale:.1f}.", flush=True)
    budgets = {k: v * scale for k, v in BUDGETS["tiny" if args.tiny else "gpu"].items()}
    for item in args.budget:
        stage, _, seconds = item.partition("=")
        if stage not in STAGES or not _positive(seconds):
            raise SystemExit(f"error: --budget takes STAGE=SECONDS with a stage among {', '.join(STAGES)} and seconds "
                             f"> 0, got {item!r}.")
        budgets[stage] = float(seconds)
    check_own_files(args.out, ["report.md", "report.json"], args.overwrite, "doctor report")  # before any stage
    dropped = earlier_stages(args.out, args.stages)
    if dropped:
        print(f"note: {dropped}", flush=True)
    (args.out / "stages").mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for i, name in enumerate(args.stages, 1):
        record = _run_child(name, args.out, args.tiny, budgets[name])
        report = write_report(args.out, args.stages, time.perf_counter() - start, dropped)
        print(f"[{i}/{len(args.stages)}] {name}: {record['status']} in {record['seconds']:.0f} s "
              f"(budget {budgets[name]:.0f} s)", flush=True)
    print(f"wrote {args.out / 'report.md'} and report.json ({time.perf_counter() - start:.0f} s)")
    failed = [name for name, r in report["stages"].items() if r["status"] not in ("ok", "skipped")]
    if failed:
        raise SystemExit(f"doctor: {len(failed)} stage(s) not ok ({', '.join(failed)}); see {args.out / 'report.md'}.")
    return report


#: seconds of 400 products of two 256 x 256 float32 matrices on one thread, on the 2-core machine the --tiny
#: budgets were set on (AMD EPYC, 2026-11-24: 0.15 s)
WARMUP_REFERENCE_S = 0.15


def machine_slowdown(max_factor: float = 10.0) -> float:
    """How much slower than the budgets' machine this one runs now, from 1 to ``max_factor``: the larger of a
    timed single-thread warm-up against ``WARMUP_REFERENCE_S`` and the load average per core. A hung stage
    is still killed, at most ``max_factor`` times later."""
    import torch

    from .utils.load import is_busy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(256, 256)
        a @ a
        t0 = time.perf_counter()
        for _ in range(400):
            a @ a
        took = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    _, load, cores = is_busy()
    return min(max_factor, max(1.0, took / WARMUP_REFERENCE_S, load / cores))


def _positive(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def _run_child(name: str, out: Path, tiny: bool, budget: float) -> dict:
    """One stage in its own process group, killed with everything it started once past its budget."""
    path, log = out / "stages" / f"{name}.json", out / "stages" / f"{name}.log"
    path.unlink(missing_ok=True)
    (out / "stages" / f"{name}.partial.json").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "sa_lightning.doctor", "--stage", name, "--out", str(out), *(["--tiny"] if tiny else [])]
    paths = [str(ROOT) if ROOT else None, os.environ.get("PYTHONPATH")]  # an installed copy: its own sys.path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    seconds = time.perf_counter() - t0
    partial = out / "stages" / f"{name}.partial.json"
    if code is None:
        record = cut_record(out, name, budget)
    elif path.is_file():
        record = json.loads(path.read_text())
    else:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        record = {"status": "error", "summary": f"the stage process exited with code {code} before its result:\n\n"
                                                "```\n" + "\n".join(tail) + "\n```"}
    partial.unlink(missing_ok=True)
    record.update(stage=name, seconds=round(seconds, 1), budget_s=budget)
    write_text(path, json.dumps(record, indent=2))
    return record


def cut_record(out: Path, name: str, budget: float) -> dict:
    """The record of a stage killed at its budget: a timeout, with what the stage measured by then (its
    ``stages/<name>.partial.json``, written as its rows came) when there is any."""
    record = {"status": "timeout", "summary": f"killed after its budget of {budget:.0f} s; what it printed is in "
                                              f"`stages/{name}.log`."}
    partial = out / "stages" / f"{name}.partial.json"
    if partial.is_file():
        kept = json.loads(partial.read_text())
        record.update(data=kept.get("data"), summary=record["summary"] + " What it measured by then:\n\n"
                      + kept.get("summary", ""))
    return record


def earlier_stages(out: Path, stages) -> str | None:
    """Where ``out`` holds a report of stages this run does not run (``doctor --stages env`` into a full sitting's
    folder), the sentence that says this run's report replaces it without them; None otherwise."""
    try:
        earlier = json.loads((out / "report.json").read_text())
        names = [name for name in earlier["stages"] if name not in stages]
    except (OSError, ValueError, KeyError, TypeError):  # no report there, or not one this can read
        return None
    if not names:
        return None
    return (f"{out / 'report.md'} held the stage(s) {', '.join(names)} of an earlier run ({earlier.get('date', '?')}); "
            f"this run's report covers {', '.join(stages)} and replaces it, so those are not in it (their records stay "
            f"in {out / 'stages'}; pass another --out to keep both reports).")


def write_report(out: Path, stages, elapsed: float, dropped: str | None = None) -> dict:
    """``report.json`` and ``report.md`` from every stage finished so far (the others: not run yet); ``dropped``:
    the sentence on an earlier report's stages this one leaves out (``earlier_stages``)."""
    records = {}
    for name in stages:
        path = out / "stages" / f"{name}.json"
        records[name] = json.loads(path.read_text()) if path.is_file() else {"status": "not run"}
    env = records.get("env", {}).get("data") or {}
    lines = [f"# sa_lightning doctor, {date.today().isoformat()}", "",
             f"Device: {env.get('device', '?')}; torch {env.get('torch', '?')}, CUDA {env.get('cuda') or '–'}, "
             f"lightning {env.get('lightning', '?')}, transformers {env.get('transformers', '?')}. "
             f"{elapsed:.0f} s so far.", "", *([f"Note: {dropped}", ""] if dropped else []),
             *head(["stage", "status", "seconds (budget)"], ["---", "---", "---:"])]
    for name, r in records.items():
        took = f"{r['seconds']:.0f} ({r['budget_s']:.0f})" if "seconds" in r else "–"
        lines.append(row([name, r["status"], took]))
    for name, r in records.items():
        if r.get("summary"):
            lines += ["", f"## {name}: {r['status']}", "", r["summary"].rstrip()]
    report = {"date": date.today().isoformat(), "elapsed_s": round(elapsed, 1), "stages": records,
              **({"note": dropped} if dropped else {})}
    with replacing_files(out, "doctor report", overwrite=True) as tmp:  # checked before the first stage
        write_text(tmp / "report.json", json.dumps(report, indent=2))
        write_text(tmp / "report.md", "\n".join(lines) + "\n")
    return report


# ---- one stage, in its own process ------------------------------------------------------------------------
def run_stage(name: str, out: Path, tiny: bool) -> dict:
    """Run one stage and write ``stages/<name>.json``: status (ok, fail, skipped), a markdown summary, data."""
    try:
        record = STAGE_FUNCTIONS[name](out, tiny)
    except Exception as err:  # a stage that crashes is a finding: the report keeps its traceback's end
        tail = traceback.format_exc().strip().splitlines()[-12:]
        record = {"status": "error", "summary": f"{type(err).__name__}: {err}\n\n```\n" + "\n".join(tail) + "\n```"}
    write_text(out / "stages" / f"{name}.json", json.dumps(record, indent=2, default=str))
    print(f"{name}: {record['status']}", flush=True)
    return record


def _device(tiny: bool):
    import torch

    return torch.device("cuda" if torch.cuda.is_available() and not tiny else "cpu")


def stage_env(out: Path, tiny: bool) -> dict:
    import platform
    from importlib.metadata import version

    import torch

    data = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "lightning": version("lightning"), "transformers": version("transformers"),
            "cpu_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        data.update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", devices=torch.cuda.device_count(),
                    bf16=torch.cuda.is_bf16_supported())
    else:
        from .bench.machine import describe

        data.update(device=f"CPU ({describe('cpu')})")
    summary = "\n".join(f"- {k}: {v}" for k, v in data.items())
    return {"status": "ok", "summary": summary, "data": data}


def stage_tests(out: Path, tiny: bool) -> dict:
    """The gpu-marked tests (pytest, in a process of its own), then the exactness grid on this device."""
    import torch

    lines, status, data = [], "ok", {}
    files = sorted(str(p) for p in (ROOT / "tests").glob("test_*.py") if "mark.gpu" in p.read_text()) if ROOT else []
    files.sort(key=lambda f: Path(f).name != FIRST_GPU_TESTS)  # the compiled hash mask (random control) first
    if files and not torch.cuda.is_available():
        # without CUDA pytest would skip every one of them, after a collection that costs seconds
        data["pytest"] = {"returncode": None, "result": "not run: no CUDA", "files": [Path(f).name for f in files]}
        lines.append("`pytest -m gpu`: not run, no CUDA here (every gpu-marked test would be skipped).")
    elif files:
        t0, log = time.perf_counter(), out / "stages" / "tests_pytest.log"  # every result as it comes
        with open(log, "w") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "pytest", "-v", "-m", "gpu", "-p", "no:cacheprovider",
                                     *files], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait(timeout=PYTEST_BUDGET_S)
            except subprocess.TimeoutExpired:  # the grid below still runs
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        took = time.perf_counter() - t0
        text = log.read_text(errors="replace")
        results = [ln for ln in text.splitlines() if ln.startswith("tests/") and (" PASSED" in ln or " FAILED" in ln
                                                                               or " ERROR" in ln or " SKIPPED" in ln)]
        last = (text.strip().splitlines() or ["(no output)"])[-1] if code is not None else (
            f"cut at {PYTEST_BUDGET_S} s after {len(results)} results "
            f"({sum(' PASSED' in ln for ln in results)} passed, {sum(' FAILED' in ln for ln in results)} failed)")
        print(f"pytest -m gpu: exit {code} in {took:.0f} s", flush=True)
        data["pytest"] = {"returncode": code, "result": last, "files": [Path(f).name for f in files],
                          "results": results}
        lines.append(f"`pytest -m gpu` on {', '.join(Path(f).name for f in files)}: {last}")
        failed = [ln for ln in results if " FAILED" in ln or " ERROR" in ln]
        if (code not in (0, 5, None)) or failed:  # 5: nothing collected
            status = "fail"
            lines += ["", "```", *(failed or _failures(text))[-25:], "```", "",
                      "The whole output: `stages/tests_pytest.log`."]
        _partial(out, "tests", {"status": status, "summary": "\n".join(lines), "data": data})  # before the grid
    else:
        lines.append("`pytest -m gpu`: no tests/ folder here (an installed copy), skipped.")
    device = _device(tiny)
    grid = exactness_grid(device, n=96 if tiny else 512, window=16 if tiny else 64)
    data["exactness"] = grid
    bad = [r for r in grid if not r["ok"]]
    status = "fail" if bad or status == "fail" else status
    lines += ["", f"Exactness against the float64 oracle on {device.type}, relative to the reference's largest "
              "magnitude (bounds: float32 1e-5 forward / 1e-4 backward, bfloat16 3e-2 / 6e-2):", "",
              *head(["variant", "backend", "dtype", "forward", "backward", "ok"],
                    ["---", "---", "---", "---:", "---:", "---"])]
    lines += [row([r["variant"], r["backend"], r["dtype"], f"{r['forward']:.1e}", f"{r['backward']:.1e}",
                   "yes" if r["ok"] else "**NO**"]) for r in grid]
    return {"status": status, "summary": "\n".join(lines), "data": data}


def _failures(text: str) -> list[str]:
    """pytest's short summary (the FAILED/ERROR lines and the count), not the warnings before it."""
    lines = text.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if "short test summary info" in line), max(0, len(lines) - 25))
    return lines[start:]


def exactness_grid(device, n: int, window: int) -> list[dict]:
    """Every sparse variant (SA, SWA, SA+SWA, MoBA, the controls) on each backend of ``device`` in float32 and bfloat16, forward and backward,
    against the oracle in float64 on the same (rounded) inputs. On the CPU: banded and dense (FlexAttention
    has no CPU backward, and compiling its forward there costs half a minute; tests/test_attention_flex.py
    and tests/test_gpu_risks.py check it)."""
    import torch

    from .attention import VARIANTS, AttentionSpec, get_variant

    bounds = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (3e-2, 6e-2)}
    backends = ["flex", "banded"] if device.type == "cuda" else ["banded", "dense"]
    g = torch.Generator().manual_seed(0)
    B, H, d = 2, 2, 32
    base = [torch.randn(B, H, n, d, generator=g, dtype=torch.float64) for _ in range(3)]
    rows, t0 = [], time.perf_counter()
    for variant in (name for name, v in VARIANTS.items() if v.sparse):  # full attention is SDPA's own
        for backend in (b for b in backends if b in VARIANTS[variant].backends):
            for dtype, (fwd_bound, bwd_bound) in bounds.items():
                q, k, v = (t.to(dtype).to(device).requires_grad_(True) for t in base)
                spec = AttentionSpec(variant, window=window, block_size=max(1, window // 2), top_k=2, backend=backend)
                drawn = VARIANTS[variant].draw(spec, n, torch.full((B,), n), g) if VARIANTS[variant].draws else None
                perm = None if drawn is None else drawn.to(device)  # one draw per row (σ, hash seeds)
                outs = get_variant(variant)(q, k, v, spec, perm)
                ref_in = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
                refs = _oracle_paths(variant, *ref_in, perm, window, spec)
                fwd = max(_rel(o, r) for o, r in zip(outs, refs))
                weights = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(device) for o in outs]
                got = torch.autograd.grad(sum((o.double() * w).sum() for o, w in zip(outs, weights)), (q, k, v))
                want = torch.autograd.grad(sum((r * w).sum() for r, w in zip(refs, weights)), ref_in)
                bwd = max(_rel(a, b) for a, b in zip(got, want))
                ok = fwd <= fwd_bound and bwd <= bwd_bound
                rows.append({"variant": variant, "backend": backend, "dtype": str(dtype).removeprefix("torch."),
                             "forward": fwd, "backward": bwd, "ok": ok, "seconds": round(time.perf_counter() - t0, 1)})
                # each row as it ends: a stage killed at its budget still shows how far the grid came, and at what cost
                print(f"exactness {variant} {backend} {rows[-1]['dtype']}: forward {fwd:.1e} backward {bwd:.1e} "
                      f"{'ok' if ok else 'NOT OK'} ({rows[-1]['seconds']} s)", flush=True)
                t0 = time.perf_counter()
    return rows


def _oracle_paths(variant, q, k, v, perm, window, spec):
    from .attention import get_variant, oracle

    return [oracle.reference_attention(q, k, v, mask) for mask in get_variant(variant).oracle_masks(spec, q, k, perm)]


def _rel(got, want) -> float:
    want = want.detach().double()
    return float((got.detach().double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def stage_recompiles(out: Path, tiny: bool) -> dict:
    """10 compiled steps of a 24-layer SA model with a fresh sigma per layer and step: graphs, recompiles,
    graph breaks and FlexAttention's unfused fallback."""
    import warnings

    import torch
    from torch._dynamo.utils import counters

    from .models import ModelConfig, Transformer

    device = _device(tiny)
    train = device.type == "cuda"  # FlexAttention has no CPU backward
    # --tiny: 3 layers x 10 steps still draw 30 sigmas, past the recompile limit of 8; compiling 24 layers
    # takes minutes on a CPU
    # on a GPU 6 of the 360M model's 24 layers: the same per-layer draws and graph, a cold compile within budget
    size = dict(d_model=64, n_head=2, n_kv_head=2, max_seq_len=64, n_layer=3) if tiny else dict(max_seq_len=512,
                                                                                                 n_layer=6)
    from .attention.variants import SA

    cfg = ModelConfig.from_name("tiny" if tiny else "360m", variant=SA.name, backend="flex", **size)
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    model.compile()  # in place, as model.compile: true does
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len + 1), device=device)
    torch._dynamo.reset()
    counters.clear()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(10):
            if train:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(idx[:, :-1], perm_stream=step)
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                with torch.no_grad():
                    model(idx[:, :-1], perm_stream=step)
    seconds = time.perf_counter() - t0
    graphs = int(counters["stats"].get("unique_graphs", 0))
    recompiles = int(sum(counters["recompiles"].values())) if "recompiles" in counters else 0
    breaks = {k.splitlines()[0][:120]: v for k, v in counters["graph_break"].items()}
    skipped = sum(1 for k in counters["unimplemented"] if "falling back to eager" in k or "Skipping the frame" in k)
    fallback = [str(w.message).splitlines()[0] for w in caught if "without torch.compile" in str(w.message)]
    data = {"device": device.type, "train": train, "layers": cfg.n_layer, "seq_len": cfg.max_seq_len, "steps": 10,
            "seconds": round(seconds, 1), "unique_graphs": graphs, "recompiles": recompiles,
            "graph_breaks": sum(breaks.values()), "graph_break_reasons": breaks, "frames_skipped": skipped,
            "flex_fallback_warnings": len(fallback)}
    ok = not fallback and not breaks and recompiles <= 1
    lines = [f"{'Training' if train else 'Forward-only (FlexAttention has no CPU backward)'}: 10 steps of "
             f"{cfg.n_layer} layers x d={cfg.d_model}, seq {cfg.max_seq_len}, SA on compiled FlexAttention, "
             f"a fresh sigma per layer and step, {seconds:.0f} s.", "",
             f"- unique graphs: {graphs}; recompiles: {recompiles}; graph breaks: {sum(breaks.values())} (sigma is "
             f"drawn eagerly before the compiled block stack, and FlexAttention runs inside its graph: one graph, "
             f"no break, is the pass); frames run eagerly: {skipped}",
             f"- FlexAttention's unfused fallback warnings: {len(fallback)}"]
    lines += [f"- break x{v}: {k}" for k, v in sorted(breaks.items(), key=lambda kv: -kv[1])[:8]]
    return {"status": "ok" if ok else "fail", "summary": "\n".join(lines), "data": data}


def _partial(out: Path, name: str, record: dict) -> None:
    """What a stage has measured so far: the report shows it if the stage is killed at its budget."""
    write_text(out / "stages" / f"{name}.partial.json", json.dumps(record, indent=2, default=str))


def _rows_so_far(out: Path, name: str, lines: list[str], rows: list[dict], measure: str) -> dict:
    """A stage's record from the rows measured so far (a row whose ``measure`` is NaN without a note failed), kept
    as its partial record too."""
    failed = [r for r in rows if r[measure] != r[measure] and not r.get("note")]
    record = {"status": "fail" if failed else "ok", "summary": "\n".join(lines), "data": {"rows": rows}}
    _partial(out, name, record)
    return record


def _ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b and a == a and b == b else "–"


#: Table 2's lengths in the order the sitting measures them (8k, then 32k, the longest, then 16k and 2k)
TABLE2_LENGTHS = {"gpu": (8192, 32768, 16384, 2048), "tiny": (256, 512)}


def table2_variants() -> list[str]:
    from .attention.variants import FULL, RANDOM, SA, SA_BUCKET, SA_SWA, SWA

    return [v.name for v in (FULL, SWA, SA, SA_BUCKET, SA_SWA, RANDOM)]


def stage_table2(out: Path, tiny: bool) -> dict:
    """``bench attention --preset paper`` one length at a time (tiny: the cpu preset at two short lengths),
    each variant's cost against SWA's and full attention's, beside the paper's A100."""
    from .attention.variants import FULL, RANDOM, SA, SA_BUCKET, SA_SWA, SWA
    from .bench.attention import main as bench_attention

    argv = (["--preset", "cpu", "--repeats", "1", "--same-process", "--no-memory"] if tiny else
            ["--preset", "paper", "--repeats", "3", "--no-memory"])
    variants = table2_variants()
    rows, record = [], {}
    for n in TABLE2_LENGTHS["tiny" if tiny else "gpu"]:
        rows += bench_attention([*argv, "--lengths", str(n), "--variants", *variants,
                                 "--out", str(out / "table2" / f"n{n}"), "--overwrite"])  # the doctor's own folder
        by = {(r["n"], r["variant"]): r["ms"] for r in rows}
        lines = head(["n", "full ms", "SWA", "SA", "bucketed SA", "SA+SWA", "random", "SA ÷ SWA",
                      "bucketed ÷ SWA", "SA+SWA ÷ SWA", "random ÷ full", "full ÷ SA", "paper A100: SA, full"],
                     "---:")
        for m in sorted({r["n"] for r in rows}):
            ms = {v: by.get((m, v)) for v in variants}
            paper = PAPER_TABLE2.get(m)
            lines.append(row([m, *(number(ms[v], ".1f") for v in variants),
                              _ratio(ms[SA.name], ms[SWA.name]), _ratio(ms[SA_BUCKET.name], ms[SWA.name]),
                              _ratio(ms[SA_SWA.name], ms[SWA.name]), _ratio(ms[RANDOM.name], ms[FULL.name]),
                              _ratio(ms[FULL.name], ms[SA.name]), f"{paper[0]}, {paper[1]}" if paper else "–"]))
        lines += ["", "ms per forward and backward; full is SDPA's fused kernel (flash on CUDA), the paper's full "
                  f"a masked kernel. Every variant and measure: `{out / 'table2'}`."]
        record = _rows_so_far(out, "table2", lines, rows, "ms")
    return record


def train_variants() -> list[str]:
    """The compiled step's variants in the order the sitting measures them (SWA first: the others' reference)."""
    from .attention.variants import FULL, SA, SA_BUCKET, SA_SWA, SWA

    return [v.name for v in (SWA, SA, SA_BUCKET, FULL, SA_SWA)]


def stage_train(out: Path, tiny: bool) -> dict:
    """The 360M model's training step, compiled, one variant after another (tiny: the cpu preset, eager and
    compiled forms side by side); each variant's tokens/s against SWA's."""
    from .attention.variants import SWA
    from .bench.train import main as bench_train

    argv = (["--preset", "cpu", "--seq-len", "64", "--batch", "2", "--steps", "2", "--repeats", "1",
             "--compile", "both"] if tiny else
            ["--preset", "paper", "--steps", "5", "--repeats", "2", "--warmup", "2", "--compile", "on"])
    rows, record = [], {}
    for variant in train_variants():
        got = bench_train([*argv, "--variants", variant, "--no-data", "--out", str(out / "train" / variant),
                           "--overwrite"])  # the doctor's own folder
        rows += got[0] if isinstance(got, tuple) else got
        swa = {r["compile"]: r["tokens_per_s"] for r in rows if r["variant"] == SWA.name}
        for r in rows:
            r["x_swa_tokens"] = r["tokens_per_s"] / swa[r["compile"]] if swa.get(r["compile"]) else float("nan")
        keys = [k for k in ("variant", "compile", "step_ms", "tokens_per_s", "x_swa_tokens", "mfu", "peak_mib",
                            "note") if k in rows[0]]
        lines = head(keys)
        lines += [row([_cell(r.get(k)) for k in keys]) for r in rows]
        lines += ["", "One variant after another in one process (not interleaved); MFU counts the attention each "
                  f"variant computes (`models/flops.py`). Every measure: `{out / 'train'}`."]
        record = _rows_so_far(out, "train", lines, rows, "tokens_per_s")
    return record


def stage_profile(out: Path, tiny: bool) -> dict:
    """``bench profile --what layer moves``: where SWA's, SA's and bucketed SA's time goes, part by part, and what
    their token reorders move per layer."""
    from .attention.variants import SA, SA_BUCKET, SWA
    from .bench.profile import main as bench_profile

    argv = (["--preset", "cpu", "--n", "1024", "--repeats", "1", "--warmup", "1"] if tiny else
            ["--preset", "paper", "--repeats", "3", "--warmup", "2"])
    bench_profile([*argv, "--what", "layer", "moves", "--variants", *(v.name for v in (SWA, SA, SA_BUCKET)),
                   *(["--seq-len", "128", "--step-batch", "2"] if tiny else []), "--out", str(out / "profile"),
                   "--overwrite"])
    preset = "cpu" if tiny else "paper"
    text = (out / "profile" / f"profile_{preset}.md").read_text()
    return {"status": "ok", "summary": text.split("\n", 1)[1].strip(), "data": {"file": f"profile/profile_{preset}.md"}}


def _cell(value) -> str:
    if isinstance(value, float):
        return number(value, ".3f" if abs(value) < 10 else ",.0f")
    return "–" if value is None else str(value)


def stage_prefill(out: Path, tiny: bool) -> dict:
    from .bench.prefill import main as bench_prefill

    # --tiny: bench prefill's random 4-layer Qwen3 (building even one layer of Qwen3-8B's shapes takes 10-20 s
    # on a CPU; tests/test_bench_gpu_paths.py checks that builder and its shapes), at one length as on the GPU
    argv = (["--model", "tiny", "--lengths", "128", "--window", "32", "--repeats", "1"] if tiny else
            ["--model", "qwen3-8b-random", "--device", "cuda", "--dtype", "bfloat16",
             "--lengths", "8192", "--repeats", "2"])
    rows = bench_prefill([*argv, "--out", str(out / "prefill"), "--overwrite"])  # the doctor's own folder
    keys = [k for k in ("n", "mode", "ms", "peak_mib", "x_swa") if k in rows[0]]
    lines = head(keys)
    lines += [row([_cell(r.get(k)) for k in keys]) for r in rows]
    return {"status": "ok", "summary": "\n".join(lines), "data": {"rows": rows}}


def stage_seeds(out: Path, tiny: bool) -> dict:
    """``bench seeds``: training seeds a minute of the pass-key cell, each alone against K seeds as one ensemble
    (gpu: the GPU study preset's cell, K to 256; tiny: K = 1 and 2, one timed step)."""
    from .bench.seeds import main as bench_seeds

    argv = (["--preset", "cpu", "--ks", "1", "2", "--steps", "1", "--warmup", "1", "--repeats", "1", "--threads",
             "1"] if tiny else ["--preset", "gpu"])
    rows = bench_seeds([*argv, "--out", str(out / "seeds"), "--overwrite"])  # the doctor's own folder
    lines = head(["case", "seeds", "ms a step", "seeds a minute (training)", "× alone"],
                 ["---", "---:", "---:", "---:", "---:"])
    lines += [row([r["case"], r["seeds"], f"{r['ms_per_step']:.0f}", f"{r['seeds_per_hour'] / 60:.2f}",
                   f"{r['vs_alone']:.2f}"]) for r in rows]
    lines += ["", f"Training steps only, the medians over the rounds. Every measure: `{out / 'seeds'}`."]
    return {"status": "ok", "summary": "\n".join(lines), "data": {"rows": rows}}


def stage_decide(out: Path, tiny: bool) -> dict:
    """``study long-range --preset decide-l4-gpu``: the deciding test of the permutation at 128 training seeds per
    compared arm, each arm's seeds in ensembles (tiny: SA and Random at two seeds and two steps on the CPU). Every
    few seconds the count of finished cells is kept, so that a stage cut at its budget says how far it got; its
    cells stay in ``decide/`` and the same command continues them."""
    import threading

    from .experiments.long_range import main as study

    folder = out / "decide"
    argv = ["--preset", "decide-l4-gpu", "--out", str(folder)]
    if tiny:
        argv += ["--variants", "sa", "random", "--seeds", "0", "1", "--ensemble", "2", "--set",
                 "trainer.accelerator=cpu", "--set", "trainer.max_steps=2", "--set", "trainer.val_check_interval=2",
                 "--set", "data.init_args.val_examples=32"]
    stop = threading.Event()

    def keep_count() -> None:
        while not stop.wait(5):
            done = len(list((folder / "cells").glob("*.json")))
            _partial(out, "decide", {"status": "timeout", "summary": f"{done} cell(s) finished in `{folder}`; "
                                     "the same command trains the rest.", "data": {"cells": done}})
    threading.Thread(target=keep_count, daemon=True).start()
    try:
        records = study(argv)["records"]
    finally:
        stop.set()
    rows = json.loads((folder / "compare.json").read_text())["comparisons"]
    lines = head(["outcome", "A", "B", "seeds", "A − B [95%; a range under five seeds]", "verdict"],
                 ["---", "---", "---", "---:", "---", "---"])
    for r in rows:
        bounds = "" if r.get("lo") is None else f" [{r['lo']:+.3f}, {r['hi']:+.3f}]"
        shown = f"{r['mean']:+.3f}" + (" range" if r.get("form") == "range" and bounds else "") + bounds
        lines.append(row([r["outcome"], r["a"], r["b"], r["units"], shown, r["verdict"]]))
    lines += ["", f"{len(records)} cells; differences in the outcome's own unit (acc: a fraction of the answers, "
              f"logp: nats). The study's tables and figures: `{folder}`."]
    return {"status": "ok", "summary": "\n".join(lines), "data": {"cells": len(records), "comparisons": rows}}


STAGE_FUNCTIONS = {"env": stage_env, "tests": stage_tests, "table2": stage_table2, "train": stage_train,
                   "profile": stage_profile, "recompiles": stage_recompiles, "prefill": stage_prefill,
                   "seeds": stage_seeds, "decide": stage_decide}


if __name__ == "__main__":  # a stage's child process: the CLI's malloc settings (``main.py``), then the stage
    from sa_lightning.utils.cpu_allocator import tune_cpu_allocator

    tune_cpu_allocator()
    main()
