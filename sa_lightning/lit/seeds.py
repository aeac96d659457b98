"""Many training seeds of one cell in one process: K ``LitLM`` members, equal but for their seed, trained as one
member-stacked model (``models.stacked``), each exactly as it would train alone under ``cli.py fit``.

What each member keeps of its own, as alone:
- its initialisation and data order: each member is built by the CLI under its own ``seed_everything`` and reads
  its own DataModule's batches (the seed is linked into the data's and the model's);
- its attention draws: each step's σ permutations or hash seeds come from the member's own model
  (``Transformer.draws`` with its seed and the step's stream), one per row of its batch;
- its gradient: the members' losses are summed, and no number of one member reaches another's loss;
- its clipping: the global norm of its own gradients, as ``torch.nn.utils.clip_grad_norm_`` takes it alone;
- its optimizer: AdamW is elementwise, so one AdamW over the stacked parameters is K AdamWs (every member is at the
  same step, so their bias corrections and schedule positions are one).

Lightning's loop is not used for the stacked model (its automatic optimization would clip the ensemble's global
norm); each member's validation runs through Lightning's ``Trainer.validate`` on the member's own ``LitLM``, its
weights copied out of the stack (``SeedEnsemble.unstack``).

Checkpoints (``save_member``). After training, each member whose own ``fit`` would leave a ``last.ckpt`` gets one,
where that fit would write it (``<log_dir>/checkpoints/last.ckpt`` of its logger's version): its weights, its
slice of the optimizer state, the schedule's position and the loop counters of a fit that ended at its last step
(``lightning_private.finished_fit_loops``), handed to its own ``Trainer``, which restores them as
``--ckpt_path`` resumes a run (nothing trains: the run is at ``max_steps``) and saves them in Lightning's format
with every callback's and the data's state. So ``cli.py fit --ckpt_path`` resumes a member as its seed's own
checkpoint, and a study scores a member again from it instead of training it (``experiments.training``). The
periodic ``step<N>.ckpt`` of a fit are not written: only the state at the end exists.

Exactness. On the CPU a member trains **bit for bit** as its seed alone: the same losses at every step, the same
validation loss, answers and log-probabilities (``tests/test_ensemble.py``: K = 1, 3 and 8, SA, Random, SWA, SA+SWA
and Full, float32, clipping active, one thread; torch 2.13; a manual run with two threads agreed too). That holds
because every op of the stack gives each member's rows the numbers its model alone gives them: the stacked
forward, its gradients (the norms norm the rows as they come, ``models.stacked.StackedRMSNorm``), each member's norm
and clipping, and AdamW, elementwise on the stacked tensors. A change that breaks it (a fused kernel that sums in
another order) shows in those tests. On a GPU, where even a seed alone may not repeat bit for bit (atomic adds in
some backward kernels), the GPU test allows ``GPU_RTOL``; it has not run yet.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from ..models.stacked import fold_draws, stack_members
from ..utils.atomic import WriteError, replacing
from .accuracy import DistanceAccuracy
from .module import LitLM
from .schedule import steps_for_tokens, warmup_cosine

#: how far (relative) a member's training losses on a GPU may lie from its seed's alone over the GPU test's steps
#: (the CPU's are equal); not yet measured
GPU_RTOL = 1e-3
#: the trainer precisions an ensemble trains with (Lightning's, as its fit would): float32, or bf16 autocast
PRECISIONS = ("32-true", "bf16-mixed")


@dataclass
class TrainSettings:
    """What the ensemble reads of a member's ``Trainer``: the same for every member."""

    max_steps: int
    gradient_clip_val: float | None = None
    val_every: int | None = None
    log_every: int = 50
    precision: str = "32-true"

    @classmethod
    def of(cls, trainer, batches_per_epoch: int) -> "TrainSettings":
        """The settings of a member's (unfitted) Lightning ``trainer``; one sentence for what the ensemble cannot
        do as a fit would."""
        if trainer.max_steps is None or trainer.max_steps < 1:
            raise ValueError("an ensemble of seeds trains for trainer.max_steps optimizer steps; set it (>= 1).")
        if trainer.accumulate_grad_batches != 1 or trainer.world_size != 1:
            raise ValueError("an ensemble of seeds trains on one device without gradient accumulation "
                             f"(got {trainer.world_size} processes, accumulate_grad_batches="
                             f"{trainer.accumulate_grad_batches}).")
        if str(trainer.precision) not in PRECISIONS:
            raise ValueError(f"an ensemble of seeds trains with trainer.precision {' or '.join(PRECISIONS)}, not "
                             f"{trainer.precision}.")
        if trainer.limit_train_batches not in (None, 1.0):
            raise ValueError("an ensemble of seeds trains on every training batch of an epoch; trainer."
                             f"limit_train_batches={trainer.limit_train_batches} is not supported.")
        if trainer.gradient_clip_algorithm not in (None, "norm"):
            raise ValueError(f"an ensemble of seeds clips each member's gradient norm; gradient_clip_algorithm "
                             f"{trainer.gradient_clip_algorithm!r} is not supported.")
        interval = trainer.val_check_interval
        val_every = int(interval) if isinstance(interval, int) else max(1, int(batches_per_epoch * float(interval)))
        if trainer.limit_val_batches == 0:
            val_every = None
        return cls(int(trainer.max_steps), trainer.gradient_clip_val, val_every, int(trainer.log_every_n_steps),
                   str(trainer.precision))


@dataclass
class SeedEnsemble:
    """K ``LitLM`` members as one stacked model with one AdamW and one schedule (the members share the config).
    ``losses[k]``: member k's training loss at each step so far."""

    members: list
    settings: TrainSettings
    tokens_per_step: int
    losses: list = field(default_factory=list)
    #: training batches in an epoch of each member's loader (``math.inf`` where it has no length)
    batches_per_epoch: float = math.inf

    def __post_init__(self):
        check_members(self.members)
        first = self.members[0]
        self.net = stack_members([m.net for m in self.members])
        self.optimizer, self.scheduler = self._optimizer(first.hparams)
        self.losses = [[] for _ in self.members]
        self.step = 0

    def _optimizer(self, hp):
        # the groups of ``LitLM.configure_optimizers``: decay for each member's matrices, none for its vectors
        params = list(self.net.parameters())
        decay, no_decay = [p for p in params if p.dim() >= 3], [p for p in params if p.dim() < 3]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr, betas=tuple(hp.betas), eps=hp.eps)
        total = self.settings.max_steps
        warmup = hp.warmup_steps
        if hp.warmup_tokens is not None:
            warmup = steps_for_tokens(hp.warmup_tokens, self.tokens_per_step)
        warmup = min(int(warmup or 0), max(total - 1, 0))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(warmup, total, hp.min_lr / hp.lr))
        return optimizer, schedule

    def training_step(self, batches: Sequence) -> torch.Tensor:
        """One optimizer step of every member on its own batch (``batches[k]``); the members' losses (K,)."""
        if len(batches) != len(self.members):
            raise ValueError(f"an ensemble of {len(self.members)} members got {len(batches)} batches.")
        inputs = [LitLM.targets_of(b)[0] for b in batches]
        rows, n = inputs[0].shape
        if any(x.shape != inputs[0].shape for x in inputs):
            raise ValueError("the members' batches must have one shape (the members share their data config).")
        stream = self.step  # LitLM.training_step's stream on one device: micro_step * world_size + rank
        draws = [m.net.draws(n, stream, inputs[0].device) for m in self.members]
        perms = fold_draws(draws, rows, self.members[0].net.variant.draw_ndim)
        # bf16-mixed as Lightning's precision plugin runs a training step: forward and loss under autocast
        with torch.autocast(inputs[0].device.type, dtype=torch.bfloat16,
                            enabled=self.settings.precision == "bf16-mixed"):
            scores = self.net(torch.cat(inputs), perms=perms).view(len(self.members), rows, n, -1)
            losses = torch.stack([LitLM.loss_of_scores(scores[k], b) for k, b in enumerate(batches)])
        losses.sum().backward()
        self._clip()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        for k, m in enumerate(self.members):
            m.micro_step += 1
            m.tokens_seen += inputs[k].numel()
            self.losses[k].append(float(losses[k].detach()))
        return losses.detach()

    def _clip(self) -> None:
        """Each member's gradients scaled as ``clip_grad_norm_`` scales a model's alone: by the global norm of its own
        gradients (``get_total_norm``, then the same clamped coefficient and in-place multiply)."""
        clip = self.settings.gradient_clip_val
        if not clip:
            return
        grads = [p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        for k in range(len(self.members)):
            mine = [g[k] for g in grads]  # views: scaled in place, as clip_grad_norm_ scales a model's own
            coef = torch.clamp(float(clip) / (torch.nn.utils.get_total_norm(mine) + 1e-6), max=1.0)
            torch._foreach_mul_(mine, coef)

    def member_optimizer_state(self, k: int) -> dict:
        """Member k's optimizer state as its own AdamW holds it alone (``LitLM.configure_optimizers``, the
        ``state_dict`` a checkpoint keeps): the stack holds the member's parameters in the member's order, each in
        the same group (a stacked parameter has one more dimension: the matrices decay, the vectors do not), so
        the member's state is the stack's with each per-parameter tensor's k-th slice; the step, the learning rate
        and the other settings are every member's."""
        member = self.members[k]
        ours = [(n, p.dim() - 1) for n, p in self.net.named_parameters()]
        if ours != [(n, p.dim()) for n, p in member.net.named_parameters()] or \
                len(ours) != len(list(member.parameters())):
            raise ValueError("the stack's parameters are not the member's, in its order: its optimizer state "
                             "cannot be taken apart.")
        state = self.optimizer.state_dict()
        sliced = {index: {key: value[k].clone() if torch.is_tensor(value) and value.dim() > 0
                          else value.clone() if torch.is_tensor(value) else value
                          for key, value in per.items()}
                  for index, per in state["state"].items()}
        return {"state": sliced, "param_groups": [dict(group) for group in state["param_groups"]]}

    @torch.no_grad()
    def unstack(self) -> None:
        """Copy each member's trained weights out of the stack into its own ``LitLM`` (for validation, scoring,
        checkpoints)."""
        stacked = dict(self.net.named_parameters(remove_duplicate=False))
        for k, m in enumerate(self.members):
            for name, p in m.net.named_parameters():
                p.copy_(stacked[name][k])


def check_members(members: Sequence) -> None:
    """One sentence unless the members are ``LitLM`` s of one config that differ only in their seed."""
    if not members:
        raise ValueError("an ensemble of seeds needs at least one member.")
    if not all(isinstance(m, LitLM) for m in members):
        raise ValueError("an ensemble of seeds trains LitLM models only.")

    def config(m):
        arch = {**m.arch.to_dict(), "seed": None}
        return arch, {k: v for k, v in dict(m.hparams).items() if k != "arch" and not k.startswith("_")}

    first = config(members[0])
    for m in members[1:]:
        if config(m) != first:
            raise ValueError("the members of an ensemble must share every model setting but the seed.")
    if any(m.hparams.get("compile") for m in members):
        raise ValueError("an ensemble of seeds runs eagerly: model.compile must be false.")
    if any(m.hparams.get("init_weights") for m in members):
        raise ValueError("an ensemble of seeds starts from each seed's own initialisation, not model.init_weights.")
    if len({m.arch.seed for m in members}) != len(members):
        raise ValueError("the members of an ensemble must have distinct seeds.")


def _epochs(loader):
    """The loader's batches epoch after epoch, its sampler told each epoch as Lightning tells it."""
    epoch = 0
    while True:
        for sampler in {id(s): s for s in (getattr(loader, "sampler", None),
                                           getattr(getattr(loader, "batch_sampler", None), "sampler", None))}.values():
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def train_seeds(members: Sequence[LitLM], datamodules: Sequence, settings: TrainSettings, *,
                validate: Callable[[int, int], None] | None = None,
                log: Callable[[int, int, float], None] | None = None, device=None,
                each_step: Callable[[int], None] | None = None) -> SeedEnsemble:
    """Train ``members`` (``LitLM`` s equal but for their seed), each on its own DataModule's training batches, for
    ``settings.max_steps`` steps as one ``SeedEnsemble``. Every ``settings.val_every`` steps the weights are copied
    back into the members and ``validate(k, step)`` runs for each; every ``settings.log_every`` steps
    ``log(k, step, loss)``; ``each_step(step)`` after every step. ``device``: where the stack trains (default:
    where the members are). At the end every member holds its trained weights."""
    check_members(members)
    if len(datamodules) != len(members):
        raise ValueError(f"an ensemble of {len(members)} members needs as many DataModules, got {len(datamodules)}.")
    for dm in datamodules:
        dm.prepare_data()
        dm.setup("fit")
    loaders = [dm.train_dataloader() for dm in datamodules]
    dm = datamodules[0]
    tokens = getattr(dm, "batch_size", 1) * getattr(dm, "seq_len", 1)
    ensemble = SeedEnsemble([m.to(device) if device is not None else m for m in members], settings, tokens)
    try:
        ensemble.batches_per_epoch = len(loaders[0])
    except TypeError:  # an iterable without a length: one endless epoch
        pass
    for m in members:
        m.train()
    streams = [_epochs(loader) for loader in loaders]
    here = next(ensemble.net.parameters()).device
    for step in range(1, settings.max_steps + 1):
        losses = ensemble.training_step([move_data_to_device(next(s), here) for s in streams])
        if each_step is not None:
            each_step(step)
        if log is not None and step % settings.log_every == 0:
            for k, loss in enumerate(losses.tolist()):
                log(k, step, loss)
        if validate is not None and settings.val_every and step % settings.val_every == 0:
            ensemble.unstack()
            for k in range(len(members)):
                validate(k, step)
    ensemble.unstack()
    return ensemble


def fit_clis(clis: Sequence, say: Callable[[str], None] | None = None) -> float:
    """Train the members that ``lit.cli.run(args, run=False)`` built, one CLI per seed of one ``cli.py fit`` line,
    as one ensemble (``train_seeds``), in the place of each one's ``trainer.fit``: every ``val_check_interval``
    steps each member is validated with its config's ``DistanceAccuracy`` and the metrics go to its own logger
    (its TensorBoard folder, where a study reads its learning curve), as its fit would log them; its training
    loss every ``log_every_n_steps``. ``say`` gets a line per validation. The seconds the ensemble trained."""
    start = time.perf_counter()
    trainer = clis[0].trainer
    interval = trainer.val_check_interval
    batches = 1 if isinstance(interval, int) else len(clis[0].datamodule.train_dataloader())
    settings = TrainSettings.of(trainer, batches)

    validations = []  # (step, validation batches) of each validation: every member's are the same

    def validate(k: int, step: int) -> None:
        cli = clis[k]
        callbacks = [DistanceAccuracy() for c in cli.trainer.callbacks if isinstance(c, DistanceAccuracy)]
        checker = L.Trainer(accelerator=cli.trainer.accelerator, devices=1, precision=cli.trainer.precision,
                            logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
        metrics = checker.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]
        if k == 0:
            validations.append((step, int(sum(checker.num_val_batches))))
        if cli.trainer.logger is not None:  # at the step a fit logs them: the batch index, from 0
            cli.trainer.logger.log_metrics(metrics, step - 1)
        if say is not None:
            say(f"member {k + 1}/{len(clis)} (seed {cli.model.arch.seed}) at step {step}/{settings.max_steps}: "
                + ", ".join(f"{name} {metrics[name]:.3f}" for name in ("val/loss", "val/acc") if name in metrics))

    def log(k: int, step: int, loss: float) -> None:
        if clis[k].trainer.logger is not None:
            clis[k].trainer.logger.log_metrics({"train/loss": loss}, step - 1)

    last = [start]

    def heartbeat(step: int) -> None:  # a line at least every 30 s, as a quiet fit's Heartbeat prints
        now = time.perf_counter()
        if say is not None and now - last[0] >= 30:
            last[0] = now
            say(f"training at step {step} of {settings.max_steps}, {now - start:.0f} s")

    device = trainer.strategy.root_device
    ensemble = train_seeds([c.model for c in clis], [c.datamodule for c in clis], settings, validate=validate,
                           log=log, device=device, each_step=heartbeat)
    for k, cli in enumerate(clis):
        path = save_member(cli, ensemble, k, validations)
        if say is not None and path is not None:
            say(f"member {k + 1}/{len(clis)} (seed {cli.model.arch.seed}): {path}")
    for cli in clis:
        if cli.trainer.logger is not None:
            cli.trainer.logger.finalize("success")
    return time.perf_counter() - start


def writes_last(trainer) -> bool:
    """Whether ``trainer``'s own fit would leave a ``last.ckpt``: it checkpoints (a ``ModelCheckpoint``) with
    ``save_last``, or has ``CheckpointAtEnd``."""
    from .callbacks import CheckpointAtEnd

    callback = trainer.checkpoint_callback
    return callback is not None and (bool(callback.save_last) or any(isinstance(c, CheckpointAtEnd)
                                                                     for c in trainer.callbacks))


def save_member(cli, ensemble: SeedEnsemble, k: int, validations: Sequence[tuple[int, int]]) -> str | None:
    """Member k's ``last.ckpt`` (``cli``: the member's ``lit.cli.run(args, run=False)``, trained in ``ensemble``;
    ``validations``: (step, batches) of each validation it ran), where its own fit would write it; its path, or
    None where that fit writes none (no ``ModelCheckpoint`` with ``save_last``, no ``CheckpointAtEnd``) or the
    data is a stream (its readers' position is the ensemble's loader's, not kept in a form a fit restores).

    The member's state goes to its own ``Trainer`` as a checkpoint to resume from (``trainer.fit(ckpt_path=...)``:
    the run is at ``max_steps``, so nothing trains and no batch is read), then Lightning saves what it restored,
    with its callbacks', data's and module's own entries, as a fit saves ``last.ckpt``."""
    from .callbacks import CheckpointAtEnd, last_checkpoint_path
    from .lightning_private import finished_fit_loops, saves_at_step

    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    if not writes_last(trainer) or getattr(data, "mode", None) == "stream":
        return None
    steps = ensemble.step
    callback = trainer.checkpoint_callback
    # the state its fit's last.ckpt holds: as the last batch ended where a save came then (a periodic save at the
    # last step, or CheckpointAtEnd with nothing after it), else as training ended (ModelCheckpoint's save_last)
    at_batch_end = saves_at_step(callback, steps) or (not callback.save_last and any(
        isinstance(c, CheckpointAtEnd) for c in trainer.callbacks))
    ran = [(step, batches) for step, batches in validations if step < steps or not at_batch_end]
    per_epoch = ensemble.batches_per_epoch
    first = 0 if math.isinf(per_epoch) else (max(1, math.ceil(steps / per_epoch)) - 1) * int(per_epoch)
    loops = finished_fit_loops(trainer, steps, per_epoch, sum(1 for step, _ in ran if step > first),
                               ran[-1][1] if ran else 0, at_batch_end)
    state = {"epoch": loops["fit_loop"]["epoch_progress"]["current"]["completed"], "global_step": steps,
             "pytorch-lightning_version": L.__version__, "state_dict": model.state_dict(), "loops": loops,
             "optimizer_states": [ensemble.member_optimizer_state(k)],
             "lr_schedulers": [ensemble.scheduler.state_dict()]}
    model.on_save_checkpoint(state)  # the module's own entry: its micro-step, tokens and architecture
    with tempfile.TemporaryDirectory(dir=trainer.default_root_dir, prefix=".member-") as folder:
        resume = f"{folder}/state.pt"  # not a .ckpt: ``--ckpt_path last`` never takes it
        try:  # as a cell's checkpoint is written (``AtomicCheckpointIO``): a full disk is one sentence
            with replacing(resume, "checkpoint") as tmp, open(tmp, "wb") as fh:
                torch.save(state, fh)
        except WriteError as err:  # named by the member and its run folder, not the hidden file it resumes from
            root, reason = str(trainer.default_root_dir), os.strerror(err.errno) if err.errno else "write error"
            raise WriteError(err.errno, f"the checkpoint of ensemble member {k + 1} (seed {model.arch.seed}) could "
                             f"not be written in {root!r} ({reason}); nothing was replaced, the previous checkpoint "
                             "there (if any) is intact; free space or pass a writable folder, then run again.",
                             root) from None
        trainer.fit(model, datamodule=data, ckpt_path=resume, weights_only=True)
    if trainer.global_step != steps:
        raise RuntimeError(f"member {k}: its trainer restored step {trainer.global_step}, not {steps}.")
    path = last_checkpoint_path(trainer)
    trainer.checkpoint_callback.last_model_path = path  # ModelCheckpoint's own record of its last.ckpt
    trainer.save_checkpoint(path, weights_only=False)
    return path
