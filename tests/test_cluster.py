"""SLURM: the templates parse, and `cli.py submit` drives fake sbatch/srun/scontrol with the right command lines."""
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli_here
from tests.test_sweep_reuse import two_models  # noqa: F401  (a fixture: tiny Qwen3 models)

ROOT = Path(__file__).resolve().parents[1]
SHIM = """#!/usr/bin/env bash
printf "%s\n" "$(basename "$0") $*" >> "$SHIM_LOG"
{body}
"""


def _shims(folder: Path) -> dict:
    bodies = {"sbatch": 'echo "4242"', "srun": "", "scontrol": ""}
    for name, body in bodies.items():
        path = folder / name
        path.write_text(SHIM.format(body=body))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    log = folder / "calls.log"
    # the job scripts call `python`: this test's own interpreter, also from a venv that is not activated
    here = Path(sys.executable).parent
    return {**os.environ, "PATH": f"{folder}:{here}:{os.environ['PATH']}", "SHIM_LOG": str(log), "PYTHONPATH": str(ROOT)}


def _submit(tmp_path, monkeypatch, *args):
    """``cli.py submit`` run from ``tmp_path`` with the fake SLURM commands first on PATH, in this process
    (``run_cli_here``: no interpreter start); the environment is returned for the scripts it wrote."""
    env = _shims(tmp_path)
    for key in ("PATH", "SHIM_LOG"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.chdir(tmp_path)
    return run_cli_here("submit", *args), env


@pytest.mark.parametrize("script", sorted((ROOT / "sa_lightning/slurm").glob("*.sbatch")), ids=lambda p: p.name)
def test_every_slurm_script_parses(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_pretrain_submission_runs_srun_with_one_task_per_gpu_and_requeue(tmp_path, monkeypatch):
    proc, env = _submit(tmp_path, monkeypatch, "pretrain", "--config", str(ROOT / "configs/pretrain_360m.yaml"), "--nodes", "2",
                        "--gpus_per_node", "4", "--time", "1-00:00:00", "--sbatch=--account=abc",
                        "--model", str(ROOT / "configs/model/sa.yaml"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    script = tmp_path / "runs/pretrain_360m/submit_pretrain.sbatch"
    text = script.read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --signal=SIGUSR1@90", "#SBATCH --requeue", "#SBATCH --time=1-00:00:00",
                 "#SBATCH --account=abc"):
        assert line in text
    calls = Path(env["SHIM_LOG"]).read_text().splitlines()
    assert "sbatch --parsable" in calls[0] and calls[0].endswith("runs/pretrain_360m/submit_pretrain.sbatch")
    # run the generated script as SLURM would, with srun faked: check the training command line
    job_env = {**env, "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "4"}
    done = subprocess.run(["bash", str(script)], env=job_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    srun = Path(env["SHIM_LOG"]).read_text().splitlines()[-1]
    assert srun.split()[0].endswith("srun")
    assert f"{ROOT / 'cli.py'} fit --config {ROOT / 'configs/pretrain_360m.yaml'}" in srun
    assert "--trainer.num_nodes 2 --trainer.devices 4 --trainer.default_root_dir runs/pretrain_360m" in srun
    assert srun.endswith(f"--model {ROOT / 'configs/model/sa.yaml'}")


@pytest.mark.slow  # the prepare job runs cli.py prepare
def test_pretrain_with_prepare_tokenizes_in_a_cpu_job_first_and_trains_from_the_cache(tmp_path, monkeypatch):
    config = str(ROOT / "configs/pretrain_360m.yaml")
    proc, env = _submit(tmp_path, monkeypatch, "pretrain", "--config", config, "--prepare", "--offline",
                        "--model", str(ROOT / "configs/model/sa.yaml"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    prepare = (tmp_path / "runs/pretrain_360m/submit_prepare.sbatch").read_text()
    assert "#SBATCH --cpus-per-task=32" in prepare and "--gpus" not in prepare
    assert "\nexport HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1\n" in prepare  # --offline: the job stays offline
    calls = Path(env["SHIM_LOG"]).read_text().splitlines()
    assert calls[0].endswith("submit_prepare.sbatch")
    assert "--dependency=afterok:4242" in calls[1] and calls[1].endswith("submit_pretrain.sbatch")
    done = subprocess.run(["bash", str(tmp_path / "runs/pretrain_360m/submit_prepare.sbatch")],
                          env={**env, "SLURM_CPUS_PER_TASK": "32", "PATH": f"{tmp_path}:{env['PATH']}"},
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    # the real prepare runs here: offline (--offline), the paper's Hub tokenizer fails in one line before any work
    assert done.stderr.strip().splitlines()[-1].startswith("error: tokenizer 'mistralai/Mistral-7B-v0.1' cannot be")
    train = (tmp_path / "runs/pretrain_360m/submit_pretrain.sbatch").read_text()
    assert train.rstrip().endswith("--data.mode cache")


@pytest.mark.slow
def test_sweep_submission_is_a_job_array_plus_a_report_job(tmp_path, monkeypatch):
    proc, env = _submit(tmp_path, monkeypatch, "sweep", "--config", str(ROOT / "configs/sweep/qwen3_8b.yaml"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    script = tmp_path / "outputs/sweep/qwen3_8b/slurm/submit_sweep.sbatch"
    text = script.read_text()
    assert "#SBATCH --array=0-16" in text  # full + 6 swa + 6 sa + 4 moba
    calls = Path(env["SHIM_LOG"]).read_text().splitlines()
    assert len(calls) == 2 and "--dependency=afterany:4242" in calls[1] and "sweep --config" in calls[1]
    for index, expected in ((0, '--modes [full]'), (7, "--modes [sa] --windows [16]"),
                            (16, "--modes [moba] --moba_block_sizes [256]")):
        done = subprocess.run(["bash", str(script)], env={**env, "SLURM_ARRAY_TASK_ID": str(index)},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        srun = Path(env["SHIM_LOG"]).read_text().splitlines()[-1]
        assert f"{expected} --cells_only" in srun and "--out outputs/sweep/qwen3_8b" in srun  # tasks side by side


JOB_VARS = ("SRUN_CPUS_PER_TASK", "OMP_NUM_THREADS", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
HUB_SWITCHES = JOB_VARS[2:]
ENV_SHIM = """#!/usr/bin/env bash
printf "%s\\n" "$(basename "$0") {fields}" >> "$JOB_ENV_LOG"
"""


def _env_shims(folder: Path) -> Path:
    """Fake ``srun`` and ``python`` that log the environment the job script hands them (``<unset>`` where a
    variable is not set) to ``$JOB_ENV_LOG``, and run nothing."""
    folder.mkdir()
    fields = " ".join(f"{key}=${{{key}-<unset>}}" for key in JOB_VARS)
    for name in ("srun", "python"):
        (folder / name).write_text(ENV_SHIM.format(fields=fields))
        (folder / name).chmod(0o755)
    return folder


@pytest.mark.parametrize("offline", [False, True], ids=["hub", "offline"])
@pytest.mark.slow
def test_every_job_script_gives_srun_its_cpus_and_sets_threads_and_hub_switches(offline, tmp_path, monkeypatch):
    """Slurm >= 22.05: srun does not inherit the job's --cpus-per-task, so each script exports
    SRUN_CPUS_PER_TASK before srun; OMP_NUM_THREADS is the CPUs per task (1 for prepare's process per core);
    the Hub switches are the script's, not the submitting shell's: unset, or set with --offline. Every template
    in sa_lightning/slurm/ is rendered (dry run) and run with fake srun/python in a shell that says the opposite."""
    from sa_lightning import cluster

    rendered, render = [], cluster.render
    monkeypatch.setattr(cluster, "render",
                        lambda template, fields: rendered.append(template) or render(template, fields))
    submissions = {"pretrain": ["--config", str(ROOT / "configs/pretrain_360m.yaml"), "--cpus_per_task", "6"],
                   "prepare": ["--config", str(ROOT / "configs/pretrain_360m.yaml"), "--cpus_per_task", "12"],
                   "sweep": ["--config", str(ROOT / "configs/sweep/qwen3_8b.yaml"), "--cpus_per_task", "5"]}
    scripts, printed = [], ""
    for job, args in submissions.items():
        proc, env = _submit(tmp_path, monkeypatch, job, *args, "--dry_run", *(["--offline"] if offline else []))
        assert proc.returncode == 0, proc.stderr[-2000:]
        printed += proc.stdout
        scripts += [tmp_path / line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("wrote ")]
    assert sorted(set(rendered)) == sorted(p.name for p in (ROOT / "sa_lightning/slurm").glob("*.sbatch"))
    assert len(scripts) == 3
    # the shell that submits says the opposite of what the job needs, and sets no OpenMP threads
    shell = {key: value for key, value in env.items() if key not in ("OMP_NUM_THREADS", *HUB_SWITCHES)}
    if not offline:
        shell.update({key: "1" for key in HUB_SWITCHES})
    bin_dir = _env_shims(tmp_path / "job_bin")
    for script in scripts:
        text = script.read_text()
        cpus = re.search(r"^#SBATCH --cpus-per-task=(\d+)$", text, re.M).group(1)
        srun_lines = [n for n, line in enumerate(text.splitlines()) if line.startswith("srun ")]
        exports = [n for n, line in enumerate(text.splitlines()) if line.startswith("export SRUN_CPUS_PER_TASK=")]
        assert exports and all(exports[0] < n for n in srun_lines), f"{script.name}: no SRUN_CPUS_PER_TASK before srun"
        log = tmp_path / f"{script.name}.env"
        job_env = {**shell, "PATH": f"{bin_dir}:{shell['PATH']}", "JOB_ENV_LOG": str(log),
                   "SLURM_CPUS_PER_TASK": cpus, "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "1",
                   "SLURM_ARRAY_TASK_ID": "0"}
        done = subprocess.run(["bash", str(script)], env=job_env, capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        (command, *pairs), = [line.split() for line in log.read_text().splitlines()]
        seen = dict(pair.split("=", 1) for pair in pairs)
        assert command == ("srun" if srun_lines else "python"), script.name
        assert seen["SRUN_CPUS_PER_TASK"] == cpus, script.name
        assert seen["OMP_NUM_THREADS"] == (cpus if srun_lines else "1"), script.name
        hub = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "<unset>"} if offline \
            else dict.fromkeys(HUB_SWITCHES, "<unset>")
        assert {key: seen[key] for key in HUB_SWITCHES} == hub, script.name
    # the sweep's report job (sbatch --wrap) sets the same switches
    report = [line for line in printed.splitlines() if line.startswith("$ sbatch") and "--wrap" in line]
    assert len(report) == 1
    assert ("export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1; cd " if offline
            else "unset HF_HUB_OFFLINE HF_DATASETS_OFFLINE TRANSFORMERS_OFFLINE; cd ") in report[0]


def test_an_inherited_offline_switch_is_set_explicitly_not_dropped_silently(tmp_path, monkeypatch):
    """Submitted from an offline shell without --offline, the jobs go online: submit says so in one line."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    config = str(ROOT / "configs/pretrain_360m.yaml")
    proc, _ = _submit(tmp_path, monkeypatch, "pretrain", "--config", config, "--dry_run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "note: this shell sets HF_HUB_OFFLINE=1; the jobs unset it" in proc.stdout
    proc, _ = _submit(tmp_path, monkeypatch, "pretrain", "--config", config, "--dry_run", "--offline")
    assert "note:" not in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["pretrain", "--config", "nope.yaml"], "config 'nope.yaml' does not exist"),
    (["pretrain", "--config", str(ROOT / "configs/pretrain_360m.yaml"), "--time", "forever"], "--time must look like"),
    (["pretrain", "--config", str(ROOT / "configs/pretrain_360m.yaml"), "--nodes", "0"], "--nodes must be >= 1"),
    (["sweep", "--config", str(ROOT / "configs/sweep/qwen3_8b.yaml"), "--nodes", "2"], "--nodes must be 1"),
    (["pretrain", "--config", str(ROOT / "configs/pretrain_360m.yaml"), "--job_name", "x\nrm -rf ~"],
     "--job_name may hold letters, digits and . _ + - only"),
    (["pretrain", "--config", str(ROOT / "configs/pretrain_360m.yaml"), "--sbatch=--account=a\nrm -rf ~"],
     "--sbatch takes one sbatch option"),
    (["pretrain", "--config", str(ROOT / "configs/pretrain_360m.yaml"), "--sbatch=--comment=$(id)"],
     "--sbatch takes one sbatch option"),
])
def test_bad_submissions_fail_in_one_line(args, message, tmp_path, monkeypatch):
    proc, env = _submit(tmp_path, monkeypatch, *args)
    assert proc.returncode != 0
    assert message in proc.stderr.strip().splitlines()[-1]
    assert not Path(env["SHIM_LOG"]).exists()


@pytest.mark.slow
def test_sigusr1_under_slurm_saves_requeues_and_the_requeued_job_resumes_exactly(tmp_path, monkeypatch):
    """Lightning's SLURM path with fake scontrol: SIGUSR1 at step 3 -> hpc_ckpt + `scontrol requeue <job>`;
    the requeued job, started in the same run directory, resumes from it with the same batches and losses.
    The signalled job is a process; the requeued one runs in this process, in the same environment."""
    import json

    import torch

    env = {**_shims(tmp_path), "SLURM_JOB_ID": "77", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "sa_test",
           "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NNODES": "1",
           "SLURM_NODELIST": "localhost", "SLURM_NTASKS_PER_NODE": "1",
           "OMP_NUM_THREADS": str(torch.get_num_threads())}  # this process's threads: the same losses

    def fit(record, *extra, here=False):
        callbacks = [{"class_path": "sa_lightning.lit.SaveOnSignal"},
                     {"class_path": "tests.helpers.RecordBatches", "init_args": {"out": str(tmp_path / record)}},
                     *extra]
        args = ["fit", "--config", str(ROOT / "configs/tiny.yaml"), "--config", str(ROOT / "tests/configs/fast.yaml"),
                "--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.callbacks", json.dumps(callbacks),
                "--ckpt_path", "last", "--fresh_if_no_last", "true"]  # as sa_lightning/slurm/pretrain.sbatch
        if here:
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            monkeypatch.chdir(ROOT)
            proc = run_cli_here(*args)
        else:
            proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads((tmp_path / record / "rank0.json").read_text())

    first = fit("first", {"class_path": "tests.helpers.SignalAt", "init_args": {"step": 3, "signal": "SIGUSR1"}})
    assert "scontrol requeue 77" in Path(env["SHIM_LOG"]).read_text()
    hpc = tmp_path / "run" / "hpc_ckpt_1.ckpt"
    assert hpc.exists()
    # a real `scontrol requeue` ends the job at once; the fake lets it train on to step 6 (the reference
    # batches), so the checkpoints it wrote after the requeue are removed, as if it had stopped there
    for later in (tmp_path / "run").rglob("*.ckpt"):
        if later.stat().st_mtime_ns > hpc.stat().st_mtime_ns:
            later.unlink()
    requeued = fit("requeued", here=True)
    assert [s["step"] for s in requeued] == [4, 5, 6]
    assert [s["rows"] for s in requeued] == [s["rows"] for s in first[3:]]
    assert [s["loss"] for s in requeued] == pytest.approx([s["loss"] for s in first[3:]], rel=1e-6, abs=1e-6)


def test_submit_checks_what_a_job_would_refuse_before_anything_queues(tmp_path, monkeypatch):
    """Issue 51: ``submit sweep --out X`` sent X to the array tasks only; ``submit pretrain --gpus-per-node 8``
    and a bad fit argument failed only when the job started; an unknown task was not checked at submit time."""
    pretrain = str(ROOT / "configs/pretrain_360m.yaml")
    proc, env = _submit(tmp_path, monkeypatch, "pretrain", "--config", pretrain, "--gpus-per-node", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "#SBATCH --gpus-per-node=8" in (tmp_path / "runs/pretrain_360m/submit_pretrain.sbatch").read_text()
    Path(env["SHIM_LOG"]).unlink()
    proc, env = _submit(tmp_path, monkeypatch, "pretrain", "--config", pretrain, "--trainer.max_stepz", "5")
    assert proc.returncode != 0 and "would fail at its start" in proc.stderr.strip().splitlines()[-1]
    assert "max_stepz" in proc.stderr.strip().splitlines()[-1] and not Path(env["SHIM_LOG"]).exists()
    sweep = str(ROOT / "configs/sweep/tiny.yaml")
    proc, env = _submit(tmp_path, monkeypatch, "sweep", "--config", sweep, "--out", "elsewhere")
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (tmp_path / "elsewhere" / "slurm" / "submit_sweep.sbatch").read_text()
    assert "--out elsewhere" in text and "--out outputs" not in text
    report = Path(env["SHIM_LOG"]).read_text().splitlines()[1]
    assert "--out elsewhere" in report
    Path(env["SHIM_LOG"]).unlink()
    proc, env = _submit(tmp_path, monkeypatch, "sweep", "--config", sweep, "--tasks", "[hellaswg]")
    assert proc.returncode != 0 and "unknown task 'hellaswg'" in proc.stderr.strip().splitlines()[-1]
    assert not Path(env["SHIM_LOG"]).exists()


def test_a_results_folder_takes_the_submit_folder_as_its_own_and_nothing_else(tmp_path):
    """What ``submit sweep`` leaves in --out before the array's first task (its ``slurm/`` folder: the script and
    SLURM's logs) does not make it a folder of other files; a file of the user's beside it still does, and so does
    a file named ``slurm``."""
    from sa_lightning.utils.atomic import SUBMIT_FOLDER, check_results_folder

    (tmp_path / SUBMIT_FOLDER).mkdir()
    (tmp_path / SUBMIT_FOLDER / "submit_sweep.sbatch").write_text("#!/usr/bin/env bash\n")
    (tmp_path / SUBMIT_FOLDER / "slurm-7_0.out").write_text("")
    assert check_results_folder(tmp_path, "sweep") == tmp_path
    (tmp_path / "thesis.tex").write_text("the user's own")
    with pytest.raises(ValueError, match="holds other files and no sweep of its own"):
        check_results_folder(tmp_path, "sweep")
    other = tmp_path / "other"
    other.mkdir()
    (other / SUBMIT_FOLDER).write_text("a file, not submit's folder")
    with pytest.raises(ValueError, match="holds other files and no sweep of its own"):
        check_results_folder(other, "sweep")

#: A stand-in ``sbatch`` that runs each job on this machine before it answers, as SLURM would run it: the options
#: of its command line over the script's ``#SBATCH`` lines, an array's tasks all started at once (each with
#: ``SLURM_ARRAY_TASK_ID`` and the rest, its output where ``--output`` says, ``%A``/``%a``/``%j``/``%x`` filled in;
#: a folder of it that does not exist fails the task, as it does on a cluster), ``--wrap`` through ``sh -c``, and a
#: ``--dependency`` on a job it does not know refused. Each job's tasks, times and exit codes go to ``$SLURM_STATE``.
FAKE_SBATCH = r'''#!{python}
import json, os, re, subprocess, sys, time
from pathlib import Path

state = Path(os.environ["SLURM_STATE"])
state.mkdir(exist_ok=True)
args, opts, wrap, script = sys.argv[1:], {{}}, None, None
while args:
    arg = args.pop(0)
    if arg == "--wrap":
        wrap = args.pop(0)
    elif arg.startswith("--"):
        key, _, value = arg[2:].partition("=")
        opts[key] = value
    else:
        script = arg
        break
if script:
    for line in Path(script).read_text().splitlines():
        found = re.match(r"#SBATCH --([\w-]+)(?:=(\S*))?\s*$", line)
        if found:
            opts.setdefault(found[1], found[2] or "")
job = str(100 + len(list(state.glob("job_*.json"))))
for dep in filter(None, re.split(r"[,?]", opts.get("dependency", ""))):
    kind, *ids = dep.split(":")
    for other in ids:
        if not (state / f"job_{{other}}.json").is_file():
            sys.exit(f"sbatch: error: Batch job submission failed: Job dependency problem ({{dep}})")
        done = json.loads((state / f"job_{{other}}.json").read_text())
        if kind == "afterok" and any(t["code"] != 0 for t in done["tasks"]):
            sys.exit(f"sbatch: error: the dependency {{dep}} can never be satisfied")
array = opts.get("array")
indices = list(range(int(array.split("-")[0]), int(array.split("-")[1].split("%")[0]) + 1)) if array else [None]
command = ["sh", "-c", wrap] if wrap is not None else ["bash", script]
tasks = []
for index in indices:
    pattern = opts.get("output") or ("slurm-%A_%a.out" if array else "slurm-%j.out")
    log = pattern.replace("%A", job).replace("%a", str(index)).replace("%j", job).replace("%x", opts.get("job-name", ""))
    env = {{**os.environ, "SLURM_JOB_ID": job, "SLURM_CPUS_PER_TASK": opts.get("cpus-per-task", "1")}}
    if array:
        env.update(SLURM_ARRAY_JOB_ID=job, SLURM_ARRAY_TASK_ID=str(index), SLURM_ARRAY_TASK_COUNT=str(len(indices)),
                   SLURM_ARRAY_TASK_MIN=str(indices[0]), SLURM_ARRAY_TASK_MAX=str(indices[-1]))
    task = {{"index": index, "log": log, "start": time.time()}}
    if Path(log).parent.is_dir():
        task["proc"] = subprocess.Popen(command, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    tasks.append(task)
for task in tasks:
    task["code"] = task.pop("proc").wait() if "proc" in task else "no folder for its output"
    task["end"] = time.time()
(state / f"job_{{job}}.json").write_text(json.dumps({{"job": job, "options": opts, "command": command,
                                                     "tasks": tasks}}))
print(job if "parsable" in opts else f"Submitted batch job {{job}}")
'''


def _fake_slurm(folder: Path) -> dict:
    """``sbatch`` (``FAKE_SBATCH``) and ``srun`` (runs its command) first on PATH; the environment to run them in."""
    folder.mkdir()
    (folder / "sbatch").write_text(FAKE_SBATCH.format(python=sys.executable))
    (folder / "srun").write_text('#!/usr/bin/env bash\necho "srun $* (task ${SLURM_ARRAY_TASK_ID-})" >&2\nexec "$@"\n')
    for name in ("sbatch", "srun"):
        (folder / name).chmod(0o755)
    here = Path(sys.executable).parent  # the jobs' `python`: this test's own interpreter
    return {"PATH": f"{folder}:{here}:{os.environ['PATH']}", "SLURM_STATE": str(folder / "state"),
            "PYTHONPATH": str(ROOT)}


@pytest.mark.slow  # two array tasks and the report job, each a process of its own, beside one sweep in this process
def test_a_submitted_sweep_runs_as_slurm_runs_it_and_reports_what_one_process_does(two_models, tmp_path,
                                                                                     monkeypatch):
    """Issue 78: ``submit sweep`` wrote its script into the sweep's --out, SLURM its logs beside it, and every array
    task and the report job then refused that folder ("holds other files and no sweep of its own"). Here the
    generated script runs as SLURM runs it (a stand-in sbatch on this machine: the array's tasks at once, then the
    report job after them): each task computes its own cells at the same time as the other, and the report equals
    that of the same sweep in one process."""
    import json

    from sa_lightning.experiments.sweep import main as sweep
    from sa_lightning.inference import sweep_report

    config = tmp_path / "sweep.yaml"
    config.write_text(f"model: {two_models[0]}\ndtype: float32\ndevice_map: cpu\ntasks: [shakespeare_lastword]\n"
                      "modes: [full, sa, swa]\nwindows: [8]\nseeds: [0]\nlimit: 4\n"
                      "comparisons: [{a: sa, b: swa, match: equal_w}]\nout: outputs/sweep/fake\n")
    for key, value in _fake_slurm(tmp_path / "bin").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    # a flag given to submit reaches every job, and an array task's own --modes and --windows still win over it
    modes = ["--modes", "[sa, swa]"]
    proc = run_cli_here("submit", "sweep", "--config", str(config), "--cpus_per_task", "1", "--offline", *modes)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = tmp_path / "outputs/sweep/fake"
    array, report = (json.loads(p.read_text()) for p in sorted((tmp_path / "bin/state").glob("job_*.json")))
    assert [t["index"] for t in array["tasks"]] == [0, 1]
    assert report["options"]["dependency"] == f"afterany:{array['job']}"
    logs = {t["index"]: Path(t["log"]).read_text() if Path(t["log"]).is_file() else t["code"]
            for t in array["tasks"] + report["tasks"]}
    assert [t["code"] for t in array["tasks"] + report["tasks"]] == [0, 0, 0], logs
    # each task computed its own cell, the two at the same time
    for task, cell in zip(array["tasks"], ("sa_w8_s0", "swa_w8_s0")):
        assert f"{cell}_shakespeare_lastword" in Path(task["log"]).read_text(), logs
        assert "--cells_only: 1 cells" in Path(task["log"]).read_text(), logs
    first, second = array["tasks"]
    cells = {p.name.split("_w8")[0]: p.stat().st_mtime for p in (out / "cells").glob("*_shakespeare_lastword.json")}
    assert set(cells) == {"sa", "swa"}
    assert second["start"] < cells["sa"] and first["start"] < cells["swa"]  # each written after the other began
    # the report job reused both cells and wrote the tables; its log and the array's are kept with the sweep
    assert "2 cells, 2 already done, 0 to run" in logs[None], logs[None]
    assert all(Path(t["log"]).resolve().parent == (out / "slurm").resolve() for t in array["tasks"] + report["tasks"])
    single = tmp_path / "single"
    monkeypatch.setattr(sweep_report, "figures", lambda *args: {})  # the figures have tests of their own
    sweep(["--config", str(config), "--out", str(single), *modes])
    for name in ("results.json", "compare.json"):
        got, want = (json.loads((folder / name).read_text()) for folder in (out, single))
        rows = "rows" if name == "results.json" else "comparisons"
        assert got[rows] == want[rows], name
    assert (out / "table.md").read_text() == (single / "table.md").read_text()


def _sitting(cwd: Path, out: Path, *args) -> subprocess.CompletedProcess:
    """``bash scripts/gpu_sitting.sh *args`` from ``cwd`` (its ``outputs/doctor`` is there), packing into ``out``,
    with this test's interpreter as the script's ``python3``."""
    env = {**os.environ, "OUT": str(out), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}
    return subprocess.run(["bash", str(ROOT / "scripts/gpu_sitting.sh"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # three sittings, each a doctor process (two of them with a stage process)
def test_a_sitting_fails_with_the_doctors_status_and_never_leaves_an_earlier_report(tmp_path):
    """Issue 78: scripts/gpu_sitting.sh printed "sitting done" and exited 0 when the doctor failed, and left the
    previous sitting's report.md, report.json and doctor.tgz in $OUT (and copied the doctor folder's old report),
    so its caller read another sitting's report as this one's. A refused start, a stage cut at its budget, then a
    passing sitting (the CPU's --tiny), each into the folders an earlier sitting left."""
    import json

    out, doctor = tmp_path / "sitting", tmp_path / "outputs/doctor"
    earlier = {"report.md": "# an earlier sitting\n", "report.json": '{"stages": {}}', "doctor.tgz": "old",
               "doctor.log": "old", "gpu.txt": "old"}
    for folder in (out, doctor):
        folder.mkdir(parents=True)
        for name, text in earlier.items():
            if folder is out or name.startswith("report"):
                (folder / name).write_text(text)
    (out / "notes.txt").write_text("the caller's own")
    # the doctor refuses before its first stage: its status, no report at all
    res = _sitting(tmp_path, out, "--tiny", "--budget_scale", "-1")
    said = res.stdout + res.stderr
    assert res.returncode == 1 and "sitting done" not in said, said
    assert "--budget_scale must be > 0" in said
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("sitting failed: the doctor exited with 1 before its first stage"), said
    assert sorted(p.name for p in out.iterdir()) == ["doctor.log", "gpu.txt", "notes.txt"]  # nothing earlier
    assert "an earlier sitting" not in (out / "doctor.log").read_text()
    # a stage fails: the doctor's status, the stage named, and this sitting's own report (with what it measured)
    res = _sitting(tmp_path, out, "--tiny", "--stages", "env", "--budget", "env=0.01")
    said = res.stdout + res.stderr
    assert res.returncode == 1 and "sitting done" not in said, said
    assert res.stderr.strip().splitlines()[-1].startswith(
        "sitting failed: the doctor exited with 1; not ok: env (timeout); this sitting's report is "), said
    assert "| env | timeout |" in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["stages"]["env"]["status"] == "timeout"
    assert (out / "doctor.tgz").stat().st_size > 100
    # a sitting that passes: exit 0, "sitting done", its own report in place of the failed one
    res = _sitting(tmp_path, out, "--tiny", "--stages", "env")
    assert res.returncode == 0 and "sitting done at " in res.stdout, res.stdout + res.stderr
    assert json.loads((out / "report.json").read_text())["stages"]["env"]["status"] == "ok"
    assert (out / "notes.txt").read_text() == "the caller's own"
