"""``cli.py submit``: fill the sbatch templates in ``sa_lightning/slurm/`` (package data) from a config and
submit them.

    python cli.py submit pretrain --config configs/pretrain_360m.yaml --nodes 2 --gpus_per_node 4
    python cli.py submit pretrain --config configs/pretrain_360m.yaml --prepare   # tokenize first, then train from the cache
    python cli.py submit prepare --config configs/pretrain_360m.yaml --cpus_per_task 32
    python cli.py submit sweep --config configs/sweep/qwen3_8b.yaml --gpus_per_node 1 --time 08:00:00
    ... --dry_run      # write and print the script and the sbatch command, submit nothing

pretrain: ``srun`` with one task per GPU, ``--signal=SIGUSR1@90``, requeue into a fixed run directory
(Lightning saves ``hpc_ckpt`` on the signal and resumes from it); with ``--prepare`` a CPU job running
``cli.py prepare`` goes first and training (``--data.mode cache``) waits for it (``afterok``). prepare:
that CPU job alone. sweep: a job array with one
(mode, window) pair per array task, then a report job (``--dependency=afterany``) that writes the
tables and plots from the finished cells (and runs any cell a task left unfinished). The sweep's script and
every job's log (``slurm-<job>_<task>.out``; the report job's ``slurm-<job>.out``) are kept in ``<out>/slurm/``,
with the sweep.

The jobs run ``python <checkout>/cli.py`` from a checkout of the repository and ``python -m sa_lightning.main``
(the ``sa-lightning`` command) from an installed copy, which has no cli.py.

Every job sets its own environment rather than inheriting the submitting shell's (sbatch passes it all on):
``SRUN_CPUS_PER_TASK`` = the job's CPUs per task (srun no longer inherits ``--cpus-per-task`` since Slurm
22.05), ``OMP_NUM_THREADS`` = the CPUs per task (1 in the prepare job, which runs a process per core) unless
already set, and the Hub switches: ``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE`` and ``TRANSFORMERS_OFFLINE``
are unset, so that a job streams from the Hub even when submitted from an offline shell; ``--offline``
exports ``HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1`` instead (the models, tokenizers and data sets must then be
in the local caches).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
from pathlib import Path

from .utils.atomic import SUBMIT_FOLDER
from .utils.checkout import PACKAGE, checkout_root
from .utils.argtypes import doc_help

TEMPLATES = PACKAGE / "slurm"
HUB_SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def hub_env(offline: bool) -> str:
    """The shell line that sets a job's Hub switches: offline (local caches only) or unset (the Hub)."""
    return "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1" if offline else f"unset {' '.join(HUB_SWITCHES)}"


def cli_command() -> str:
    """What follows ``python`` in a job to run this sa_lightning: the checkout's cli.py, or the installed module."""
    root = checkout_root()
    return shlex.quote(str(root / "cli.py")) if root else "-m sa_lightning.main"


def render(template: str, fields: dict[str, str]) -> str:
    text = (TEMPLATES / template).read_text()
    for key, value in fields.items():
        text = text.replace("{{" + key + "}}", str(value))
    missing = sorted(set(re.findall(r"{{(\w+)}}", text)))
    if missing:
        raise ValueError(f"template {template} has unfilled fields: {', '.join(missing)}.")
    return text


def _sbatch_lines(extra: list[str]) -> str:
    return "\n".join(f"#SBATCH {arg}" for arg in extra)


def _submit(script: Path, dry_run: bool, extra: list[str] = ()) -> str | None:
    cmd = ["sbatch", "--parsable", *extra, str(script)]
    print("$ " + shlex.join(cmd), flush=True)
    if dry_run:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    except FileNotFoundError:
        raise ValueError("sbatch is not on PATH: run `cli.py submit` on a SLURM login node, or add --dry_run.") from None
    except subprocess.CalledProcessError as err:
        raise ValueError(f"sbatch refused the job: {err.stderr.strip() or err.stdout.strip()}") from None
    job = done.stdout.strip().split(";")[0]
    print(f"submitted job {job}", flush=True)
    return job


def sweep_pairs(config: str, extra: list[str] = ()):
    """The sweep's distinct (mode, window or MoBA block size) pairs, one per array task, and its config, read with
    the command line's own overrides (``extra``: ``--out``, ``--modes``, ...) as the array tasks will read it; its
    tasks are checked against lm-eval's names here, before anything is queued."""
    from .attention import get_variant
    from .eval.harness import resolve_tasks
    from .eval.position import is_position_task
    from .experiments.sweep import EXPERIMENT
    from .inference.plan import cells

    cfg = EXPERIMENT.parse(["--config", config, *extra])[0]
    resolve_tasks([t for t in cfg.tasks if not is_position_task(t)] or ["offline"])  # an unknown task fails now
    pairs = []
    for cell in cells(cfg):
        setting = cell.spec.block_size if get_variant(cell.mode).blocked else (cell.spec.window or 0)
        if (cell.mode, setting) not in pairs:
            pairs.append((cell.mode, setting))
    return pairs, cfg


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(prog="cli.py submit", **doc_help(__doc__))
    p.add_argument("job", choices=("pretrain", "prepare", "sweep"),
                   help="pretrain: a training job; prepare: a tokenizing CPU job; sweep: a job array and its report job")
    p.add_argument("--config", required=True, help="the fit config (pretrain, prepare) or sweep config (sweep)")
    p.add_argument("--nodes", type=int, default=1, help="pretrain: nodes to train on")
    # sbatch spells these with dashes: both spellings are this command's, never passed on to the job
    p.add_argument("--gpus_per_node", "--gpus-per-node", type=int, default=None,
                   help="GPUs per node (pretrain) or per array task (sweep) (default: 4 for pretrain, 1 for sweep)")
    p.add_argument("--cpus_per_task", "--cpus-per-task", type=int, default=None,
                   help="CPU cores per task (default: 8 for pretrain and sweep, 32 for prepare)")
    p.add_argument("--prepare", action="store_true",
                   help="pretrain: tokenize into the cache in a CPU job first, then train with --data.mode cache")
    p.add_argument("--prepare_time", "--prepare-time", default="12:00:00",
                   help="--prepare: the tokenizing job's time limit")
    p.add_argument("--time", default="48:00:00", help="each job's time limit (HH:MM:SS)")
    p.add_argument("--job_name", "--job-name", default=None,
                   help="the jobs' name (default: sa_<config name>, sweep_<config name> for a sweep)")
    p.add_argument("--run_dir", "--run-dir", default=None,
                   help="pretrain: the fixed run directory (default runs/<config name>)")
    p.add_argument("--sbatch", action="append", default=[], help="an extra #SBATCH option, e.g. --sbatch=--account=abc")
    p.add_argument("--offline", action="store_true",
                   help="the jobs export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 (local caches only); "
                        "by default they unset them and may use the Hugging Face Hub")
    p.add_argument("--dry_run", "--dry-run", action="store_true",
                   help="write and print the script and the sbatch command; submit nothing")
    args, extra = p.parse_known_args(argv)
    if not Path(args.config).is_file():
        raise FileNotFoundError(f"config {args.config!r} does not exist.")
    if args.cpus_per_task is None:
        args.cpus_per_task = 32 if args.job == "prepare" else 8
    if args.prepare and args.job != "pretrain":
        raise ValueError("--prepare chains a tokenizing job before training: it goes with `submit pretrain`.")
    for name in ("nodes", "cpus_per_task"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise ValueError(f"--gpus_per_node must be >= 1, got {args.gpus_per_node}.")
    for flag in ("time", "prepare_time"):
        if not re.fullmatch(r"(\d+-)?\d{1,3}:\d{2}:\d{2}", getattr(args, flag)):
            raise ValueError(f"--{flag} must look like HH:MM:SS or D-HH:MM:SS, got {getattr(args, flag)!r}.")
    if args.job_name is not None and not re.fullmatch(r"[A-Za-z0-9._+-]{1,128}", args.job_name):
        raise ValueError(f"--job_name may hold letters, digits and . _ + - only (it goes into the job script), "
                         f"got {args.job_name!r}.")
    for option in args.sbatch:
        if not re.fullmatch(r"--?[A-Za-z][\w-]*(=[^\s'\"`$;&|<>\\]*)?", option):
            raise ValueError(f"--sbatch takes one sbatch option such as --sbatch=--account=abc, with no spaces, quotes "
                             f"or shell characters (it becomes an #SBATCH line), got {option!r}.")
    stem = Path(args.config).stem
    offline_here = [key for key in HUB_SWITCHES
                    if os.environ.get(key, "").strip().lower() in ("1", "true", "yes", "on")]
    if offline_here and not args.offline:
        print(f"note: this shell sets {' '.join(key + '=1' for key in offline_here)}; the jobs unset it and may use "
              "the Hugging Face Hub (add --offline to keep them offline).", flush=True)
    common = {"workdir": shlex.quote(str(Path.cwd())), "cli": cli_command(),
              "config": shlex.quote(args.config), "time": args.time,
              "cpus_per_task": args.cpus_per_task, "extra_sbatch": _sbatch_lines(args.sbatch),
              "extra_args": shlex.join(extra), "hub_env": hub_env(args.offline)}
    after: list[str] = []
    if args.job == "prepare" or args.prepare:
        run_dir = args.run_dir or f"runs/{stem}"
        fields = {**common, "job_name": (args.job_name or f"sa_{stem}") + "_prepare", "run_dir": shlex.quote(run_dir),
                  "time": args.prepare_time if args.prepare else args.time,
                  "cpus_per_task": 32 if args.prepare else args.cpus_per_task}
        script = _write(Path(run_dir) / "submit_prepare.sbatch", render("prepare.sbatch", fields), args.dry_run)
        job = _submit(script, args.dry_run)
        if args.job == "prepare":
            return script
        after = [f"--dependency=afterok:{job or '<prepare job>'}"]
        common["extra_args"] = shlex.join([*extra, "--data.mode", "cache"])
    if args.job == "pretrain":
        check_fit_args(args.config, extra)
        run_dir = args.run_dir or f"runs/{stem}"
        fields = {**common, "job_name": args.job_name or f"sa_{stem}", "nodes": args.nodes,
                  "gpus_per_node": args.gpus_per_node or 4, "run_dir": shlex.quote(run_dir)}
        script = Path(run_dir) / "submit_pretrain.sbatch"
        text = render("pretrain.sbatch", fields)
    else:
        if args.nodes != 1:
            raise ValueError("the sweep runs one model per array task: --nodes must be 1.")
        pairs, cfg = sweep_pairs(args.config, extra)
        common["extra_args"] = shlex.join(_without_out(extra))  # the script's own --out is cfg.out, which has it
        fields = {**common, "job_name": args.job_name or f"sweep_{stem}", "gpus_per_node": args.gpus_per_node or 1,
                  "out": shlex.quote(cfg.out), "last_index": len(pairs) - 1,
                  "cells": " ".join(shlex.quote(f"{m} {s}") for m, s in pairs)}
        # the script and SLURM's logs go in a folder of the sweep's own inside --out (utils.atomic.SUBMIT_FOLDER,
        # which the sweep's folder check takes as its own), not among the tables (which a folder of other files
        # refuses) nor beside --out (files the user did not name, left in the folder above it): the sweep's
        # results, its job script and what each job printed stay together, to read, move or remove as one.
        # SLURM opens a job's log before the job starts and fails it when the log's folder is missing: it is
        # made here (_write), at submission.
        script = Path(cfg.out) / SUBMIT_FOLDER / "submit_sweep.sbatch"
        text = render("sweep_array.sbatch", fields)
    _write(script, text, args.dry_run)
    job = _submit(script, args.dry_run, after)
    if args.job == "sweep":
        report = (f"{common['hub_env']}; cd {common['workdir']} && "
                  f"python {common['cli']} sweep --config {common['config']} --out {fields['out']} "
                  f"{common['extra_args']}").rstrip()
        _submit_wrap(report, f"afterany:{job or '<array job>'}", fields["job_name"] + "_report", args.dry_run,
                     [f"--output={script.parent}/slurm-%j.out", *args.sbatch])
    return script


def _without_out(args: list[str]) -> list[str]:
    """``args`` without ``--out X`` / ``--out=X``."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            out.append(a)
    return out


def check_fit_args(config: str, extra: list[str]) -> None:
    """What a pretrain job's ``cli.py fit`` would refuse at its start (an unknown flag, a value of the wrong type),
    refused here before it queues: the job's command line parsed and printed (``--print_config``), nothing built.
    In this process (the parser is what the job's would be; a fresh interpreter cost seconds per submission)."""
    import contextlib
    import io

    from .lit.cli import run as run_cli

    printed, errors, said = io.StringIO(), io.StringIO(), None
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
            run_cli(["fit", "--config", config, *extra, "--print_config"], run=True)
    except SystemExit as stop:  # --print_config ends the parse with 0; a refused argument with 2 and its message
        if stop.code not in (0, None):
            said = (errors.getvalue().strip().splitlines() or [str(stop.code)])[-1].removeprefix("error: ")
    except (ValueError, TypeError) as err:  # the CLI's own one-sentence refusals (``lit.cli.config_error``)
        said = str(err)
    if said is not None:
        raise ValueError(f"the job's `cli.py fit --config {config} {shlex.join(extra)}` would fail at its start: "
                         f"{said}")


def _write(script: Path, text: str, dry_run: bool) -> Path:
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    script.chmod(0o755)
    print(f"wrote {script}", flush=True)
    if dry_run:
        print(text)
    return script


def _submit_wrap(command: str, dependency: str, name: str, dry_run: bool, sbatch: list[str]) -> None:
    cmd = ["sbatch", "--parsable", f"--dependency={dependency}", f"--job-name={name}", *sbatch, "--wrap", command]
    print("$ " + shlex.join(cmd), flush=True)
    if not dry_run:
        subprocess.run(cmd, check=True)
