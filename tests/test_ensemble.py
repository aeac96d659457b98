"""An ensemble of training seeds (``lit/seeds.py``, ``models/stacked.py``): each member trains bit for bit as the same
seed does alone under ``cli.py fit`` (its loss at every step, its validation loss, answers, log-probabilities and
accuracy), for K = 1, 3 and 8 and the five trained variants, with gradient clipping active; the members do not
couple, and each is clipped by its own norm."""
from __future__ import annotations

import functools
import tempfile

import lightning as L
import pytest
import torch

from sa_lightning.lit import DistanceAccuracy
from sa_lightning.lit.cli import run as run_cli
from sa_lightning.lit.seeds import GPU_RTOL, SeedEnsemble, TrainSettings, train_seeds
from sa_lightning.models import ModelConfig, build_model
from sa_lightning.models.stacked import fold_draws, member_state, stack_members
from tests.helpers import run_cli_here

#: one worker runs the whole file: the alone runs (``alone``, cached) serve the K = 1, 3 and 8 tests of each variant
pytestmark = pytest.mark.xdist_group("ensemble")

VARIANTS = ("sa", "random", "swa", "sa_swa", "full")
STEPS = 4
# clipping at 0.05 is active from the first step (these tiny models' gradient norms are above it), so a norm taken
# over the whole ensemble instead of each member's would move every member's loss
TINY = {"model.arch.n_layer": 2, "model.arch.d_model": 32, "model.arch.d_ff": 64, "model.arch.max_seq_len": 32,
        "model.arch.attention.window": 8, "model.warmup_steps": 2, "data.init_args.seq_len": 32,
        "data.init_args.batch_size": 4, "data.init_args.val_examples": 16, "trainer.max_steps": STEPS,
        "trainer.val_check_interval": 2, "trainer.gradient_clip_val": 0.05, "trainer.logger": "false",
        "trainer.enable_checkpointing": "false", "trainer.callbacks": "[]", "trainer.enable_progress_bar": "false",
        "trainer.enable_model_summary": "false", "trainer.num_sanity_val_steps": 0}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one thread is faster (no OpenMP spinning) and changes no number."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: the GPU's case: head dim 32, so that SA and the random control take their FlexAttention kernels
ON_GPU = {"trainer.accelerator": "gpu", "model.arch.d_model": 64, "model.arch.d_ff": 128}


#: MQAR with counters as filler (its loss adds the filler's ``aux_labels``), the token shift and a fixed σ per layer
MQAR = {"data.init_args.task": "mqar", "data.init_args.num_pairs": 2, "data.init_args.num_queries": 2,
        "data.init_args.filler": "counters", "model.arch.token_shift": "true",
        "model.arch.permutation": "deterministic"}


def member_cli(variant: str, seed: int, gpu: bool = False, task: str = "passkey"):
    args = ["--config", "configs/synthetic/passkey.yaml", "--seed_everything", str(seed),
            "--model.arch.attention.variant", variant, "--trainer.default_root_dir", tempfile.mkdtemp()]
    for key, value in {**TINY, **(ON_GPU if gpu else {}), **(MQAR if task == "mqar" else {})}.items():
        args += [f"--{key}", str(value)]
    return run_cli(args, run=False)


def validated(cli) -> dict:
    accuracy = DistanceAccuracy(keep_items=True)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[accuracy])
    metrics = trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]
    return {"loss": metrics["val/loss"], "acc": metrics["val/acc"], "logps": list(accuracy.logps),
            "hits": [hit for _, hit in accuracy.items]}


class _Losses(L.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


@functools.lru_cache(maxsize=None)
def alone(variant: str, seed: int, gpu: bool = False, task: str = "passkey") -> tuple[list[float], dict]:
    """The seed trained alone, as ``cli.py fit`` trains it (the CLI's trainer, model and data)."""
    cli = member_cli(variant, seed, gpu, task)
    losses = _Losses()
    cli.trainer.callbacks.append(losses)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return losses.losses, validated(cli)


def ensemble(variant: str, seeds: list[int], gpu: bool = False,
             task: str = "passkey") -> list[tuple[list[float], dict]]:
    clis = [member_cli(variant, s, gpu, task) for s in seeds]
    steps_validated = []
    trained = train_seeds([c.model for c in clis], [c.datamodule for c in clis],
                          TrainSettings.of(clis[0].trainer, 100),
                          validate=lambda k, step: steps_validated.append((k, step)),
                          device=clis[0].trainer.strategy.root_device)
    assert steps_validated == [(k, s) for s in (2, 4) for k in range(len(seeds))]
    return [(trained.losses[k], validated(c)) for k, c in enumerate(clis)]


def assert_as_alone(variant: str, seeds: list[int], gpu: bool = False, task: str = "passkey") -> None:
    """Every member's losses at each step and its validation (loss, each answer right or not and its log-probability)
    equal to the seed's alone: bit for bit on the CPU, within ``GPU_RTOL`` on a GPU."""
    for seed, (losses, val) in zip(seeds, ensemble(variant, seeds, gpu, task)):
        ref_losses, ref_val = alone(variant, seed, gpu, task)
        assert len(losses) == len(ref_losses) == STEPS
        assert val["hits"] == ref_val["hits"] and val["acc"] == ref_val["acc"]
        if gpu:
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=GPU_RTOL, atol=0)
            torch.testing.assert_close(torch.tensor(val["logps"]), torch.tensor(ref_val["logps"]), rtol=GPU_RTOL,
                                       atol=GPU_RTOL)
            continue
        assert losses == ref_losses, f"{variant} seed {seed}: {losses} against alone {ref_losses}"
        assert val["loss"] == ref_val["loss"] and val["logps"] == ref_val["logps"]


@pytest.mark.parametrize("variant", [v if v == "sa" else pytest.param(v, marks=pytest.mark.slow) for v in VARIANTS])
def test_one_and_three_members_train_as_alone(variant):  # SA in the quick tier, every variant in the whole suite
    assert_as_alone(variant, [0])
    assert_as_alone(variant, [0, 1, 2])


def test_mqar_with_counters_the_token_shift_and_a_fixed_sigma_trains_as_alone():
    """The filler's own loss (``aux_labels``), the token shift's linear and σ fixed per layer by each member's seed."""
    assert_as_alone("sa", [0, 1, 2], task="mqar")


def test_eight_members_train_as_alone():
    assert_as_alone("sa", list(range(8)))


@pytest.mark.slow
@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "sa"])
def test_eight_members_train_as_alone_every_variant(variant):
    assert_as_alone(variant, list(range(8)))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_members_train_as_alone_on_a_gpu(variant):
    """The same on CUDA (float32), with SA's and Random's FlexAttention kernels, at K = 3 and 8."""
    assert_as_alone(variant, [0, 1, 2], gpu=True)
    assert_as_alone(variant, list(range(8)), gpu=True)


def test_a_member_does_not_depend_on_its_companions():
    """Seed 0 beside seeds 1, 2 and beside 5, 6 (other data, draws and weights next to it): the same losses."""
    first = ensemble("sa", [0, 1, 2])[0]
    second = ensemble("sa", [0, 5, 6])[0]
    assert first[0] == second[0] and first[1] == second[1]


def test_each_member_is_clipped_by_its_own_gradient_norm():
    """Three members whose gradient norms differ (scaled 1x, 10x, 100x), all above the clip: each member's gradients
    after clipping are exactly what ``clip_grad_norm_`` makes of that member's alone, so each ends at the clip's norm
    (a norm over the whole ensemble would leave the first two far below it)."""
    clis = [member_cli("sa", s) for s in range(3)]
    ens = SeedEnsemble([c.model for c in clis], TrainSettings(STEPS, 0.05), 1)
    params = [p for group in ens.optimizer.param_groups for p in group["params"]]
    torch.manual_seed(0)
    for p in params:
        p.grad = torch.randn_like(p) * torch.tensor([1.0, 10.0, 100.0]).view(-1, *[1] * (p.dim() - 1))
    alone_grads = []
    for k in range(3):
        own = [p.grad[k].clone().requires_grad_() for p in params]
        for t in own:
            t.grad = t.detach().clone()
        torch.nn.utils.clip_grad_norm_(own, 0.05)
        alone_grads.append([t.grad for t in own])
    ens._clip()
    for k in range(3):
        assert all(torch.equal(p.grad[k], g) for p, g in zip(params, alone_grads[k]))
        norm = torch.nn.utils.get_total_norm([p.grad[k] for p in params])
        torch.testing.assert_close(norm, torch.tensor(0.05), rtol=1e-4, atol=0)


def test_the_stacked_forward_is_each_members_bit_for_bit():
    for variant in VARIANTS:
        nets = []
        for seed in range(3):
            torch.manual_seed(seed)
            nets.append(build_model(ModelConfig.from_dict(
                {"n_layer": 2, "n_head": 2, "n_kv_head": 2, "d_model": 32, "d_ff": 64, "max_seq_len": 32,
                 "vocab_size": 40, "seed": seed, "attention": {"variant": variant, "window": 8}})))
        stacked = stack_members(nets)
        idx = torch.randint(0, 40, (3, 2, 32))
        draws = fold_draws([n.draws(32, 7, None) for n in nets], 2, nets[0].variant.draw_ndim)
        with torch.no_grad():
            out = stacked(idx.reshape(6, 32), perms=draws).view(3, 2, 32, 40)
            for k, net in enumerate(nets):
                assert torch.equal(out[k], net(idx[k], perm_stream=7)), variant
                assert all(torch.equal(p, dict(net.named_parameters(remove_duplicate=False))[n]) for n, p in
                           member_state(stacked, k).items())


def test_members_must_differ_only_in_seed():
    with pytest.raises(ValueError, match="distinct seeds"):
        train_seeds([member_cli("sa", 0).model, member_cli("sa", 0).model], [], TrainSettings(1))
    other = member_cli("swa", 1)
    with pytest.raises(ValueError, match="every model setting but the seed"):
        train_seeds([member_cli("sa", 0).model, other.model], [], TrainSettings(1))


def test_a_study_groups_the_seeds_still_to_train(tmp_path):
    """``--ensemble 3`` over 2 settings x 5 seeds, seed 1 of SA already recorded: SA trains {0, 2, 3} then {4}
    alone, SWA {0, 1, 2} then {3, 4}; each member's record comes back when the runner reaches its cell."""
    from sa_lightning.experiments.ensemble import EnsembleRun
    from sa_lightning.utils import runner

    cells = [{"variant": v, "seed": s} for s in range(5) for v in ("sa", "swa")]  # the runner's seed-major order
    cell_id = lambda c: f"{c['variant']}_s{c['seed']}"  # noqa: E731
    spec_of = lambda c: {"fit_args": [], "what": cell_id(c)}  # noqa: E731
    runner.write_cell(tmp_path / "cells" / "sa_s1.json", {"scores": {}, "spec": spec_of(cells[2])})
    trained, alone = [], []

    def train(self, group, specs):
        trained.append([cell_id(c) for c in group])
        assert all(specs[cell_id(c)] == spec_of(c) for c in group)
        return {cell_id(c): {"trained_with": [cell_id(g) for g in group]} for c in group}

    run = EnsembleRun(cells, tmp_path, cell_id, spec_of, 3, score=None,
                      alone=lambda cell, spec: alone.append(cell_id(cell)) or {"alone": True}, say=lambda line: None)
    run.train = train.__get__(run)
    records = {cell_id(c): run(c, spec_of(c)) for c in cells if cell_id(c) != "sa_s1"}
    assert trained == [["sa_s0", "sa_s2", "sa_s3"], ["swa_s0", "swa_s1", "swa_s2"], ["swa_s3", "swa_s4"]]
    assert alone == ["sa_s4"] and records["sa_s4"] == {"alone": True}
    assert records["sa_s3"] == {"trained_with": ["sa_s0", "sa_s2", "sa_s3"]} and not run.ready
    assert run({"variant": "sa", "seed": 9}, {**spec_of(cells[0]), "trained": {"checkpoint": "x"}}) == {"alone": True}


@pytest.mark.slow
def test_a_study_in_ensembles_writes_each_seeds_own_record(tmp_path):
    """``study long-range --ensemble 3``: every member's ``cells/<id>.json`` as its seed's alone run writes it: the
    same keys and spec, the same scores and learning curve, number for number."""
    import json

    common = ["study", "long-range", "--preset", "quick", "--variants", "sa", "--depths", "1", "--windows",
              "8", "--eval_samples", "1", "--seeds", "0", "1", "2", "--set", "trainer.max_steps=4", "--set",
              "trainer.val_check_interval=2", "--set", "data.init_args.seq_len=32", "--set",
              "model.arch.max_seq_len=32", "--set", "data.init_args.val_examples=16", "--set",
              "data.init_args.batch_size=4", "--set", "trainer.gradient_clip_val=0.05"]
    for name, extra in (("alone", ["--jobs", "1"]), ("ensemble", ["--ensemble", "3"])):  # in this process (one thread)
        res = run_cli_here(*common, "--out", str(tmp_path / name), *extra)
        assert res.returncode == 0, res.stderr[-2000:]
    assert "ensemble of 3: passkey_sa_L1_w8_s0, passkey_sa_L1_w8_s1, passkey_sa_L1_w8_s2: training together" \
        in res.stdout
    for seed in range(3):
        alone_, member = (json.loads((tmp_path / name / "cells" / f"passkey_sa_L1_w8_s{seed}.json").read_text())
                          for name in ("alone", "ensemble"))
        assert sorted(member) == sorted(alone_) and member["steps"] == alone_["steps"] == 4
        assert json.dumps(member["spec"]).replace(str(tmp_path / "ensemble"), str(tmp_path / "alone")) \
            == json.dumps(alone_["spec"])
        assert [s for s, _ in member["curve"]] == [s for s, _ in alone_["curve"]] == [1, 3]
        assert member["scores"] == alone_["scores"] and member["curve"] == alone_["curve"]  # bit for bit


@pytest.mark.slow
def test_an_ensemble_out_of_gpu_memory_trains_as_its_halves(tmp_path, monkeypatch):
    """``--ensemble 4`` where four members do not fit (a CUDA out-of-memory error, raised here for more than two):
    the group trains as two halves, later groups take that size, and every member's record is its seed's alone."""
    import json

    from sa_lightning.lit import seeds

    real, sizes = seeds.fit_clis, []

    def small_gpu(clis, say=None):
        sizes.append(len(clis))
        if len(clis) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(clis, say=say)

    monkeypatch.setattr(seeds, "fit_clis", small_gpu)
    common = ["study", "long-range", "--preset", "quick", "--variants", "sa", "--depths", "1", "--windows", "8",
              "--eval_samples", "1", "--seeds", "0", "1", "2", "3", "4", "5", "--set", "trainer.max_steps=2",
              "--set", "trainer.val_check_interval=2", "--set", "data.init_args.seq_len=32", "--set",
              "model.arch.max_seq_len=32", "--set", "data.init_args.val_examples=8", "--set",
              "data.init_args.batch_size=4"]
    for name, extra in (("alone", ["--jobs", "1"]), ("ensemble", ["--ensemble", "4"])):
        res = run_cli_here(*common, "--out", str(tmp_path / name), *extra)
        assert res.returncode == 0, res.stderr[-2000:]
    assert sizes == [4, 2, 2, 2], sizes  # seeds 0-3 fail as one, train as 0-1 and 2-3; then 4-5 at the new size
    assert "ensemble of 4: out of GPU memory; training it as 2 and 2 instead, and at most 2 at a time from here" \
        in res.stdout
    for seed in range(6):
        alone_, member = (json.loads((tmp_path / name / "cells" / f"passkey_sa_L1_w8_s{seed}.json").read_text())
                          for name in ("alone", "ensemble"))
        assert member["scores"] == alone_["scores"] and member["curve"] == alone_["curve"]


def test_an_ensemble_below_one_is_refused_before_anything_trains():
    from sa_lightning.experiments.long_range import EXPERIMENT

    with pytest.raises(ValueError, match="ensemble must be >= 1"):
        EXPERIMENT.load("configs/study/long_range.yaml", "quick", {"ensemble": 0})
    assert EXPERIMENT.load("configs/study/long_range.yaml", "gpu-ensemble", {}).ensemble == 16


def test_bench_seeds_prints_each_case_with_its_ratio_to_alone(tmp_path, capsys):
    """``bench seeds``: a row per case, alone first, with the machine and load it ran under (no time is asserted)."""
    from sa_lightning.bench.seeds import main

    rows = main(["--ks", "1", "2", "--steps", "1", "--warmup", "1", "--repeats", "1", "--out", str(tmp_path),
                 "--set", "data.init_args.seq_len=32", "--set", "model.arch.max_seq_len=32", "--set",
                 "model.arch.attention.window=8", "--set", "data.init_args.batch_size=4"])
    assert [(r["case"], r["seeds"]) for r in rows] == [("alone", 1), ("K = 1", 1), ("K = 2", 2)]
    assert rows[0]["vs_alone"] == 1.0 and all(r["seeds_per_hour"] > 0 for r in rows)
    text = (tmp_path / "seeds_cpu.md").read_text()
    assert "| K = 2 | 2 |" in text and "load average" in text and "`data.init_args.seq_len=32`" in text


@pytest.mark.slow
def test_a_pretrain_study_in_ensembles_writes_each_seeds_own_record(tmp_path):
    """``study pretrain --ensemble 2`` (text: the embedded corpus, validation blocks and the offline tasks): each
    member's record equal to its seed's alone, score for score, and its ``last.ckpt`` equal to its seed's."""
    import json

    from sa_lightning.models.checkpoint import read_checkpoint

    common = ["study", "pretrain", "--preset", "quick", "--models", "sa@32", "--seeds", "0", "1", "--limit",
              "4", "--set", "trainer.max_steps=6", "--set", "trainer.val_check_interval=3", "--set", "data.seq_len=64",
              "--set", "model.arch.max_seq_len=64", "--set", "data.batch_size=4", "--set", "data.val_blocks=4"]
    for name, extra in (("alone", ["--jobs", "1"]), ("ensemble", ["--ensemble", "2"])):  # in this process (one thread)
        res = run_cli_here(*common, "--out", str(tmp_path / name), *extra)
        assert res.returncode == 0, res.stderr[-2000:]
    assert "ensemble of 2: sa_w32_s0, sa_w32_s1: training together" in res.stdout
    for seed in range(2):
        alone_, member = (json.loads((tmp_path / name / "cells" / f"sa_w32_s{seed}.json").read_text())
                          for name in ("alone", "ensemble"))
        assert sorted(member) == sorted(alone_) and member["steps"] == alone_["steps"] == 6
        assert member["scores"] == alone_["scores"] and member["scores_by_eval_seed"] == alone_["scores_by_eval_seed"]
        # its last.ckpt as its seed's: here saved as the last batch ended (ModelCheckpoint's periodic save at step
        # 6, and CheckpointAtEnd), before that step's validation; only the periodic step6.ckpt is the alone run's
        alone_ckpt, member_ckpt = (read_checkpoint(next((tmp_path / name / "runs" / f"sa_w32_s{seed}").glob(
            "tb/version_*/checkpoints/last.ckpt"))) for name in ("alone", "ensemble"))
        assert member_ckpt["loops"]["fit_loop"]["epoch_loop.state_dict"] == {"_batches_that_stepped": 5}
        for entry in member_ckpt["callbacks"].values():
            entry.update(dirpath=entry["dirpath"].replace(str(tmp_path / "ensemble"), str(tmp_path / "alone")),
                         last_model_path=entry["last_model_path"].replace(str(tmp_path / "ensemble"),
                                                                          str(tmp_path / "alone")))
        assert differences(member_ckpt, alone_ckpt) == \
            [f"/callbacks/{key}/best_model_path: '' != '{value['best_model_path']}'"
             for key, value in alone_ckpt["callbacks"].items()]


#: the passkey config's own logger, ModelCheckpoint (save_last) and callbacks, tiny; 2 batches an epoch, so 5 steps
#: end mid-way through a third epoch (the epoch, batch, scheduler and validation counters each restart per epoch)
SAVED = {**{k: v for k, v in TINY.items() if k not in ("trainer.logger", "trainer.enable_checkpointing",
                                                       "trainer.callbacks")},
         "trainer.max_steps": 5, "data.init_args.train_examples": 8}


def saved_args(seed: int, root) -> list[str]:
    args = ["--config", "configs/synthetic/passkey.yaml", "--seed_everything", str(seed),
            "--model.arch.attention.variant", "sa", "--trainer.default_root_dir", str(root)]
    for key, value in SAVED.items():
        args += [f"--{key}", str(value)]
    return args


def differences(a, b, here: str = "") -> list[str]:
    """Where two checkpoints' entries differ: keys, values, tensors (dtype, shape and every number)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return ([f"{here}: keys {sorted(map(str, set(a) ^ set(b)))}"] if set(a) != set(b) else []) + \
            [d for k in set(a) & set(b) for d in differences(a[k], b[k], f"{here}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return ([f"{here}: length"] if len(a) != len(b) else []) + \
            [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{here}[{i}]")]
    if torch.is_tensor(a) or torch.is_tensor(b):
        same = torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape \
            and torch.equal(a, b)
        return [] if same else [f"{here}: tensor"]
    return [] if a == b else [f"{here}: {a!r} != {b!r}"]


@pytest.mark.slow
def test_a_members_last_checkpoint_is_its_seeds_own(tmp_path):
    """Each member writes ``last.ckpt`` where its seed's own fit writes it (its logger's version), and it holds what
    that fit's holds, entry for entry: weights, optimizer state, schedule, loop counters (5 steps over three
    epochs), the data's position, the callbacks' and the module's entries; only the run folder in the paths
    differs. So ``--ckpt_path`` resumes a member as its seed alone, and a study scores it again from it."""
    from sa_lightning.lit.seeds import fit_clis
    from sa_lightning.models.checkpoint import read_checkpoint

    run_cli(["fit", *saved_args(0, tmp_path / "alone")], run=True)
    clis = [run_cli(saved_args(seed, tmp_path / f"member{seed}"), run=False) for seed in (0, 1)]
    lines = []
    fit_clis(clis, say=lines.append)
    alone = read_checkpoint(next((tmp_path / "alone").glob("tb/version_0/checkpoints/last.ckpt")))
    path = tmp_path / "member0" / "tb" / "version_0" / "checkpoints" / "last.ckpt"
    assert f"member 1/2 (seed 0): {path}" in lines
    member = read_checkpoint(path)
    assert member["global_step"] == 5 and member["epoch"] == 3
    assert member["SyntheticDataModule"]["epoch"] == 3 and member["SyntheticDataModule"]["consumed"] == 4
    for entry in member["callbacks"].values():  # the paths: each in its own run folder
        for key in ("dirpath", "last_model_path"):
            entry[key] = entry[key].replace(str(tmp_path / "member0"), str(tmp_path / "alone"))
    assert differences(member, alone) == []
    other = read_checkpoint(tmp_path / "member1" / "tb" / "version_0" / "checkpoints" / "last.ckpt")
    assert not torch.equal(other["state_dict"]["net.embed.weight"], member["state_dict"]["net.embed.weight"])
    # nothing left beside it (the state it resumed from): the same files as the alone run's folder
    assert sorted(p.relative_to(tmp_path / "member0") for p in (tmp_path / "member0").rglob("*") if p.is_file()
                  and not p.name.startswith("events.")) == \
        sorted(p.relative_to(tmp_path / "alone") for p in (tmp_path / "alone").rglob("*") if p.is_file()
               and not p.name.startswith("events."))


@pytest.mark.slow
def test_a_study_scores_an_ensembles_members_again_from_their_checkpoints(tmp_path):
    """``study long-range --ensemble 2``, then the same with another scoring setting (``--eval_samples 1 2``):
    each member is scored again from its ``last.ckpt``, not trained, its record then equal to its seed's alone
    doing the same; and the checkpoint, loaded, validates to the loss its record states."""
    import json
    import statistics

    from sa_lightning.lit import LitLM

    common = ["study", "long-range", "--preset", "quick", "--variants", "sa", "--depths", "1", "--windows", "8",
              "--seeds", "0", "1", "--set", "trainer.max_steps=4", "--set", "trainer.val_check_interval=2", "--set",
              "data.init_args.seq_len=32", "--set", "model.arch.max_seq_len=32", "--set",
              "data.init_args.val_examples=16", "--set", "data.init_args.batch_size=4"]
    ids = [f"passkey_sa_L1_w8_s{seed}" for seed in (0, 1)]
    for name, extra in (("alone", ["--jobs", "1"]), ("ensemble", ["--ensemble", "2"])):  # in this process
        out = tmp_path / name
        first = run_cli_here(*common, "--eval_samples", "1", "--out", str(out), *extra)
        assert first.returncode == 0, first.stderr[-2000:]
        checkpoints = {c: c.stat().st_mtime_ns for c in (out / "runs").glob("*/tb/version_*/checkpoints/last.ckpt")}
        assert len(checkpoints) == 2
        again = run_cli_here(*common, "--eval_samples", "1", "2", "--out", str(out), *extra)
        assert again.returncode == 0, again.stderr[-2000:]
        assert again.stdout.count("trained before with the same fit arguments; scored again from its last "
                                  "checkpoint, not trained") == 2
        assert "training together" not in again.stdout
        assert {c: c.stat().st_mtime_ns for c in checkpoints} == checkpoints  # read, not written
    assert "ensemble of 2: " + ", ".join(ids) + ": training together" in first.stdout
    for cell in ids:
        alone, member = (json.loads((tmp_path / name / "cells" / f"{cell}.json").read_text())
                         for name in ("alone", "ensemble"))
        assert sorted(member["scores"]) == ["1", "2"] and member["steps"] == alone["steps"] == 4
        assert member["scores"] == alone["scores"] and member["curve"] == alone["curve"]
    # the member's checkpoint, loaded on its own, validates as its record says (K = 1: the mean over its σ seeds)
    member = json.loads((tmp_path / "ensemble" / "cells" / f"{ids[0]}.json").read_text())
    path = next((tmp_path / "ensemble" / "runs" / ids[0]).glob("tb/version_*/checkpoints/last.ckpt"))
    model = LitLM.load_from_checkpoint(path, weights_only=True)
    data = run_cli([str(a) for a in member["spec"]["fit_args"][1:]], run=False).datamodule
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    losses = []
    for eval_seed in member["eval_seeds"]:
        model.eval_seed = eval_seed
        losses.append(trainer.validate(model, datamodule=data, verbose=False)[0]["val/loss"])
    assert len(losses) == 2 and statistics.fmean(losses) == member["scores"]["1"]["loss"]


def test_jobs_above_one_with_ensembles_is_said_not_silently_dropped(tmp_path, capsys):
    """``--jobs 2 --ensemble 2``: one line that jobs is 1 with ensembles and why; none where jobs was not a count."""
    from sa_lightning.experiments.long_range import EXPERIMENT

    cells = EXPERIMENT.cells
    cfg = EXPERIMENT.load("configs/study/long_range.yaml", "quick", {"ensemble": 2, "jobs": 2})
    EXPERIMENT.before(cfg, tmp_path, cells(cfg))
    said = capsys.readouterr().out
    assert EXPERIMENT.jobs(cfg) == 1 and said.count("jobs 2 is not used with ensembles: jobs is 1") == 1
    for jobs in ("auto", 1):
        EXPERIMENT.before(EXPERIMENT.load("configs/study/long_range.yaml", "quick", {"ensemble": 2, "jobs": jobs}),
                          tmp_path, cells(cfg))
        assert "is not used with ensembles" not in capsys.readouterr().out
    EXPERIMENT.before(EXPERIMENT.load("configs/study/long_range.yaml", "quick", {"jobs": 2}), tmp_path, cells(cfg))
    assert capsys.readouterr().out == "" and EXPERIMENT.ensembles is None


def test_a_limit_on_training_batches_is_refused():
    """A fit's epoch of ``limit_train_batches`` batches is not what the ensemble reads (every batch): refused."""
    cli = member_cli("sa", 0)
    cli.trainer.limit_train_batches = 0.5
    with pytest.raises(ValueError, match=r"every training batch of an epoch; trainer.limit_train_batches=0.5"):
        TrainSettings.of(cli.trainer, 100)


def test_a_full_disk_while_a_member_saves_is_one_sentence(tmp_path, monkeypatch):
    """A full disk while an ensemble member's checkpoint is written (issue 78): the one sentence a cell's checkpoint
    gets, naming the member, its seed and its run folder (before: 62 lines from ``save_member``'s bare
    ``torch.save``)."""
    import errno
    import os

    from sa_lightning.lit.seeds import fit_clis
    from sa_lightning.main import _os_message

    clis = [run_cli(saved_args(seed, tmp_path / f"member{seed}"), run=False) for seed in (0, 1)]

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError) as caught:
        fit_clis(clis)
    said = _os_message(caught.value) or str(caught.value)  # what the shell prints after "error: "
    assert said == (f"the checkpoint of ensemble member 1 (seed 0) could not be written in "
                    f"{str(tmp_path / 'member0')!r} (No space left on device); nothing was replaced, the previous "
                    "checkpoint there (if any) is intact; free space or pass a writable folder, then run again.")
    assert caught.value.errno == errno.ENOSPC
    assert not [p for p in (tmp_path / "member0").rglob("*") if ".member-" in str(p)]  # nothing left behind
