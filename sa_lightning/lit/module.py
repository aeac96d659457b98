"""The LightningModule: next-token cross-entropy, AdamW with warmup + cosine, and the logs the paper's
runs need. It wraps a ``Transformer`` built from ``arch`` and knows nothing of attention kernels.

A batch is a LongTensor (B, n + 1) of text, or a dict from ``SyntheticDataModule``: ``tokens`` plus
``labels`` (only the answer positions count). For such a labeled batch ``validation_step`` and
``test_step`` return the predicted tokens (``{"predictions": (B, n)}``), which callbacks score:
``DistanceAccuracy`` (``lit/accuracy.py``, in the synthetic configs) logs ``val/acc`` and
``val/acc@<bucket>`` by key-query distance.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torchmetrics.aggregation import MeanMetric

from ..data.repeats import text_targets
from ..models import ModelConfig, build_model
from ..models.ensemble import mean_over_draws
from ..models.flops import matmul_params, train_flops_per_token
from ..utils.load import pick_threads
from ..utils.runlock import RunLock
from .schedule import steps_for_tokens, tokens_per_step, warmup_cosine


#: micro-batches between two looks at the machine's load (a syscall)
BUSY_CHECK_EVERY = 50
#: validation streams each evaluation σ seed owns: with ``eval_seed`` e, batch i draws from -1 - i - e * VAL_STREAMS
VAL_STREAMS = 1 << 20


class LitLM(L.LightningModule):
    """The language model trained: its architecture, optimizer and schedule.

    Args:
        arch: the model (``ModelConfig``; ``arch.vocab_size`` is linked from the data's tokenizer).
        lr: peak learning rate of the cosine schedule (paper: 3e-4).
        min_lr: final learning rate of the cosine schedule (paper: 3e-5).
        betas: AdamW's betas (paper: 0.9, 0.95).
        weight_decay: AdamW's weight decay, applied to matrices only.
        eps: AdamW's epsilon.
        warmup_tokens: linear warmup length in tokens (paper: 0.5B); give this or warmup_steps, or neither for
            no warmup.
        warmup_steps: linear warmup length in optimizer steps, instead of warmup_tokens.
        max_tokens: total training tokens (paper: 15B); the CLI turns it into ``trainer.max_steps``. Null: the
            trainer's own limits.
        compile: wrap the model in ``torch.compile``.
        eval_samples: validation and test average the next-token probabilities over this many draws of the
            attention (``models.ensemble``; variants that draw nothing run once).
        init_weights: a checkpoint (``.ckpt`` from ``cli.py fit``) whose weights start this new run (null: fresh
            weights); nothing else of it is kept (step, optimizer, data position). Every parameter's name and shape must match,
            so settings that change no shape may differ (window, SA <-> SWA <-> full <-> MoBA, backend).
            ``--ckpt_path`` resumes a run instead; a resumed run ignores this.
    """

    def __init__(
        self,
        arch: ModelConfig = ModelConfig.from_name("tiny"),
        lr: float = 3e-4,
        min_lr: float = 3e-5,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.1,
        eps: float = 1e-8,
        warmup_tokens: int | None = None,
        warmup_steps: int | None = None,
        max_tokens: int | None = None,
        compile: bool = False,
        eval_samples: int = 1,
        init_weights: str | None = None,
    ):
        super().__init__()
        self._run_lock = None  # held by rank 0 while it fits (utils/runlock.py)
        if warmup_tokens is not None and warmup_steps is not None:
            raise ValueError("give model.warmup_tokens or model.warmup_steps, not both.")
        if not 0 <= min_lr <= lr:
            raise ValueError(f"model min_lr={min_lr} must lie in [0, lr={lr}].")
        if eval_samples < 1:
            raise ValueError(f"model eval_samples must be >= 1, got {eval_samples}.")
        if isinstance(arch, dict):  # from a checkpoint's hyper_parameters
            arch = ModelConfig.from_dict(arch)
        # hparams hold plain types only, so checkpoints load with torch.load(weights_only=True)
        self.save_hyperparameters(ignore=["arch"])
        self.hparams["arch"] = arch.to_dict()
        self.arch = arch
        self.net = build_model(arch)
        if init_weights:
            from ..models.checkpoint import load_weights

            load_weights(self.net, init_weights)
        self.compile = compile
        self.val_loss = MeanMetric()
        # text with planted repeats (data.repeats): the copies' NLL and the text's apart, as the copying is learnt
        self.val_repeat, self.val_text = MeanMetric(), MeanMetric()
        self.micro_step = 0  # training forward passes so far: the permutation stream, restored on resume
        self.tokens_seen = 0  # global (all ranks) training tokens
        self.trained_steps = 0  # optimizer steps of the loaded checkpoint
        self.unigram_ppl: float | None = None  # the data's context-free baseline for val/ppl (on_fit_start)
        # which σ seed validation draws from (``val_stream``): 0 in training; a study scores a trained model
        # under several (not an hparam: a checkpoint's model validates as it trained)
        self.eval_seed = 0

    # ---- model -------------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.compile and not getattr(self, "_compiled", False):
            self.net.compile()  # in place: parameter names (and checkpoints) stay as without compile
            self._compiled = True

    def forward(self, idx: torch.Tensor, perm_stream: int | None = None) -> torch.Tensor:
        return self.net(idx, perm_stream=perm_stream)

    @staticmethod
    def targets_of(batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets): text predicts every next token; a labeled batch only its answers."""
        if isinstance(batch, dict):
            return batch["tokens"][:, :-1], batch["labels"]
        return batch[:, :-1], batch[:, 1:]

    @staticmethod
    def cross_entropy(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss over the targets that count (-100 marks the ones that do not)."""
        return F.cross_entropy(scores.float().reshape(-1, scores.size(-1)), targets.reshape(-1), ignore_index=-100)

    def loss(self, batch, perm_stream: int | None) -> torch.Tensor:
        """The training loss: the mean over the targets, plus for a labeled batch with ``aux_labels`` (synthetic
        filler that trains a previous-token head) their own mean, so the answers keep their weight."""
        return self.loss_of_scores(self(self.targets_of(batch)[0], perm_stream), batch)

    @classmethod
    def loss_of_scores(cls, scores: torch.Tensor, batch) -> torch.Tensor:
        """``loss`` from the batch's scores (B, n, V) (an ensemble of seeds scores its members' rows at once)."""
        loss = cls.cross_entropy(scores, cls.targets_of(batch)[1])
        if isinstance(batch, dict) and "aux_labels" in batch:
            loss = loss + cls.cross_entropy(scores, batch["aux_labels"])
        return loss

    def val_stream(self, batch_idx: int) -> int:
        """The stream validation batch ``batch_idx`` draws from: the batch index alone for ``eval_seed`` 0 (val
        loss comparable across evaluations of one run), streams of its own for every other evaluation σ seed."""
        return -1 - batch_idx - self.eval_seed * VAL_STREAMS

    def eval_scores(self, inputs: torch.Tensor, stream: int, samples: int | None = None) -> torch.Tensor:
        """Next-token scores (B, n, V) whose softmax is the prediction: the logits of one pass, or with
        ``samples`` > 1 draws the log of their mean probability (``models.ensemble``, the evaluator's rule too).
        Draw s uses stream ``stream * samples - s``, so no two batches or draws share one: validation's draws
        are the run's (the σ a deterministic run trained with), not the evaluator's per-input ones. Models that
        draw nothing run once."""
        samples = self.hparams.eval_samples if samples is None else samples
        samples = samples if self.net.variant.draws else 1
        return mean_over_draws(lambda s: self(inputs, stream * samples - s), samples)

    # ---- steps -------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        # every rank and micro-batch draws its own permutations, reproducibly
        stream = self.micro_step * self.trainer.world_size + self.trainer.global_rank
        loss = self.loss(batch, stream)
        self.micro_step += 1
        self.tokens_seen += self.targets_of(batch)[0].numel() * self.trainer.world_size
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/tokens", float(self.tokens_seen))
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # a fit that started on a quiet machine and became busy: one thread from then on (utils/load.py)
        if batch_idx % BUSY_CHECK_EVERY == BUSY_CHECK_EVERY - 1 and self.device.type == "cpu" \
                and torch.get_num_threads() > 1:
            note = pick_threads()
            if note:
                print(note, file=sys.stderr, flush=True)

    def validation_step(self, batch, batch_idx: int) -> dict | None:
        """The loss; for a labeled batch also ``{"predictions": (B, n) token ids}`` for callbacks to score
        (``DistanceAccuracy``). A batch without a target that counts returns None."""
        # validation permutations depend only on the batch index: val loss is comparable across evals
        inputs, targets = self.targets_of(batch)
        scores = self.eval_scores(inputs, self.val_stream(batch_idx))
        count = (targets != -100).sum()
        if count == 0:
            return None
        if isinstance(batch, dict) and "repeat" in batch:  # text with planted repeats: the copies and the text apart
            # one per-token NLL (0 where a target does not count) gives all three means
            nll = F.cross_entropy(scores.float().transpose(1, 2), targets, ignore_index=-100, reduction="none")
            copy, text = batch["repeat"], text_targets(batch)
            self.val_loss.update(nll.sum() / count, weight=count)
            self.val_repeat.update(nll[copy].mean(), weight=copy.sum())
            self.val_text.update(nll[text].mean(), weight=text.sum())
            return None
        self.val_loss.update(self.cross_entropy(scores, targets), weight=count)
        if not isinstance(batch, dict):  # text: a loss only
            return None
        # the answer's log-probability at each position (meaningless where no answer counts): a continuous outcome
        # beside the argmax, which a model at chance or at the ceiling cannot move (``DistanceAccuracy`` keeps it
        # per answer); a gather less a logsumexp, no (B, n, V) log-softmax kept
        scores = scores.float()
        logp = scores.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1) - scores.logsumexp(-1)
        return {"predictions": scores.argmax(-1), "answer_logp": logp}

    def _log_eval(self, stage: str, prog_bar: bool) -> None:
        loss = self.val_loss.compute()
        self.val_loss.reset()
        self.log(f"{stage}/loss", loss, prog_bar=prog_bar, sync_dist=False)
        self.log(f"{stage}/ppl", torch.exp(loss), sync_dist=False)
        if self.val_repeat.update_count:  # planted repeats: the copies' NLL beside the text's (nats per token)
            self.log(f"{stage}/repeat_nll", self.val_repeat.compute(), sync_dist=False)
            self.log(f"{stage}/text_loss", self.val_text.compute(), sync_dist=False)
            self.val_repeat.reset()
            self.val_text.reset()
        if stage == "val" and self.unigram_ppl is not None:
            # the context-free baseline val/ppl should beat: a flat line beside val/ppl (see on_fit_start)
            self.log("val/unigram_ppl", self.unigram_ppl, sync_dist=False)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val", prog_bar=True)

    def test_step(self, batch, batch_idx: int) -> dict | None:
        return self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test", prog_bar=False)

    def on_before_optimizer_step(self, optimizer) -> None:
        if _fsdp_root(self.trainer.model) is not None:
            return  # each rank holds a shard: the norm is logged from FSDP's clip_grad_norm_, across ranks
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:  # before clipping (Lightning clips after this hook)
            self.log("train/grad_norm", torch.nn.utils.get_total_norm(grads))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's FSDP precision refuses norm clipping, since ``torch.nn.utils.clip_grad_norm_`` would see
        one rank's shard; FSDP's own ``clip_grad_norm_`` on the root module reduces the norm across ranks."""
        root = _fsdp_root(self.trainer.model)
        if root is not None and gradient_clip_val and gradient_clip_algorithm in (None, "norm"):
            self.log("train/grad_norm", root.clip_grad_norm_(gradient_clip_val))
            return
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    # ---- optimizer ---------------------------------------------------------------------------
    def tokens_per_step(self) -> int:
        return tokens_per_step(self.trainer, self.trainer.datamodule)

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.lr, betas=tuple(self.hparams.betas), eps=self.hparams.eps,
        )
        total = int(self.trainer.estimated_stepping_batches)
        warmup = self.hparams.warmup_steps
        if self.hparams.warmup_tokens is not None:
            warmup = steps_for_tokens(self.hparams.warmup_tokens, self.tokens_per_step())
        warmup = min(int(warmup or 0), max(total - 1, 0))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, warmup_cosine(warmup, total, self.hparams.min_lr / self.hparams.lr)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- bookkeeping -------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if stage == "fit" and self.trainer.is_global_zero and self._run_lock is None:
            self._run_lock = RunLock(self.trainer.default_root_dir)
            self._run_lock.acquire()  # a second fit into this folder is refused before it writes anything
            self.trainer.callbacks.append(_ReleaseOnException(self))  # a fit that raises skips teardown
        dm = self.trainer.datamodule
        if dm is not None and hasattr(dm, "seq_len"):  # read by TokenThroughput for flops/s and MFU
            self.flops_per_batch = self.train_flops_per_token(dm.seq_len) * dm.seq_len * dm.batch_size

    def teardown(self, stage: str) -> None:
        if stage == "fit" and self._run_lock is not None:
            self._run_lock.release()
            self._run_lock = None

    def on_fit_start(self) -> None:
        if _fsdp_root(self.trainer.model) is not None:
            # torch 2.11's FSDP (use_orig_params, bf16-mixed, one GPU: NO_SHARD) hands the tied embedding its
            # bf16 gradient view and then fails torch's check that a gradient has the parameter's dtype
            # (docs/benchmarks.md, doctor 2026-11-24). FSDP already bypasses that check for every primary
            # parameter; the tied one is told so too.
            for name, p in self.net.named_parameters(remove_duplicate=False):
                if hasattr(p, "grad_dtype") and name.startswith("lm_head."):
                    p.grad_dtype = None
        counts = {"params/total": self.net.num_parameters(),
                  "params/non_embedding": self.net.num_parameters(exclude_embedding=True)}
        dm = self.trainer.datamodule
        if dm is not None:
            counts["tokens_per_step"] = self.tokens_per_step()
            if hasattr(dm, "unigram_perplexity"):
                self.unigram_ppl = float(dm.unigram_perplexity())
                if self.trainer.is_global_zero:
                    print(f"val/ppl to beat: {self.unigram_ppl:.1f} (unigram baseline, no context)")
        for logger in self.loggers:
            logger.log_hyperparams(counts)  # hparams.yaml (TensorBoard, CSV), or the logger's own place
            if isinstance(logger, TensorBoardLogger) and self.trainer.is_global_zero:
                self._write_tensorboard_hparams(logger, counts)

    def _write_tensorboard_hparams(self, logger: TensorBoardLogger, counts: dict) -> None:
        """TensorBoard's HPARAMS tab: the module's hyperparameters (``arch/...`` flattened), the data's sequence
        length and batch size, and the parameter counts, against the run's metrics (ours, and the tags a
        callback names in its ``hparams_metrics``, as ``DistanceAccuracy`` does ``val/acc``)."""
        dm = self.trainer.datamodule
        data = {f"data/{k}": getattr(dm, k) for k in ("seq_len", "batch_size") if isinstance(getattr(dm, k, None), int)}
        params = {k: v for k, v in dict(self.hparams).items() if not k.startswith("_")}  # not LightningCLI's own
        tags = ["val/loss", "val/ppl"]
        if self.unigram_ppl is not None:
            tags.append("val/unigram_ppl")
        for callback in self.trainer.callbacks:
            tags.extend(t for t in getattr(callback, "hparams_metrics", ()) if t not in tags)
        tags.append("train/loss")
        write_hparams_summary(logger.experiment, {**params, **data, **counts}, tags, self.global_step)

    def train_flops_per_token(self, seq_len: int) -> float:
        """6N + 12 * layers * d * (keys each query's kernel computes), per trained token (``models/flops.py``);
        N counts the tied LM head, a matmul per token."""
        return train_flops_per_token(self.arch, seq_len, matmul_params(self.net))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        logger = self.logger  # None without a trainer
        checkpoint["sa_lightning"] = {"micro_step": self.micro_step, "tokens_seen": self.tokens_seen,
                                      "arch": self.arch.to_dict(),
                                      # a resumed fit logs into the same version (see lit/cli.py)
                                      "log_version": getattr(logger, "version", None)}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        from ..models.checkpoint import check_architecture
        from ..models.config import upgrade_arch

        state = checkpoint.get("sa_lightning", {})
        check_architecture(upgrade_arch(state.get("arch", {})), self.arch)
        self.micro_step = state.get("micro_step", 0)
        self.trained_steps = int(checkpoint.get("global_step") or 0)  # trainer.global_step stays 0 in test
        self.tokens_seen = state.get("tokens_seen", 0)


def hparams_for_tensorboard(params: Mapping, prefix: str = "") -> dict:
    """``params`` flattened with ``/`` (``arch/attention/window``), in the types TensorBoard's HPARAMS tab shows:
    bool, int, float and str as they are, anything else (None, a list, a tuple) as its ``str``, as Lightning's
    ``TensorBoardLogger.log_hyperparams`` shows them."""
    flat = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(hparams_for_tensorboard(value, f"{name}/"))
        else:
            flat[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return flat


def write_hparams_summary(writer, params: Mapping, tags: list[str], step: int) -> None:
    """Write TensorBoard's HPARAMS summary for ``params`` against the metric ``tags`` into ``writer`` (the
    ``torch.utils.tensorboard.SummaryWriter`` that is ``TensorBoardLogger.experiment``).

    The tab reads each metric's values from the scalars of its tag, so the summary only names the tags.
    ``TensorBoardLogger.log_hyperparams(params, metrics)`` writes this summary too, but also logs every metric
    it is given as a scalar at ``step``: a made-up ``val/loss`` point before the first validation. The
    summary goes through torch's public ``hparams`` and the writer's ``file_writer`` (as torch's own
    ``SummaryWriter.add_hparams`` does); a writer closed by an earlier fit gets a new events file, as its
    next event would."""
    from torch.utils.tensorboard.summary import hparams
    from torch.utils.tensorboard.writer import FileWriter

    file_writer = writer.file_writer
    closed = file_writer is None
    if closed:
        file_writer = FileWriter(writer.get_logdir())
    for summary in hparams(hparams_for_tensorboard(params), dict.fromkeys(tags, 0.0)):
        file_writer.add_summary(summary, step)
    file_writer.flush()
    if closed:
        file_writer.close()


def _fsdp_root(model):
    """``model`` when it is the root of a (FSDP1) FullyShardedDataParallel wrap, else None."""
    if not torch.distributed.is_available():
        return None
    from torch.distributed.fsdp import FullyShardedDataParallel

    return model if isinstance(model, FullyShardedDataParallel) else None


class _ReleaseOnException(L.Callback):
    """Drops the module's run lock when the fit ends in an exception (Lightning then calls no ``teardown``)."""

    def __init__(self, module: "LitLM"):
        self.module = module

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.module.teardown("fit")
