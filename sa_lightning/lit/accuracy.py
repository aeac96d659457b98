"""Answer accuracy of the synthetic recall tasks, overall and by key-query distance.

``AccuracyByDistance`` is the torchmetrics metric; ``DistanceAccuracy`` the callback that holds it, scores
the predictions ``LitLM.validation_step`` returns for labeled batches, and logs ``val/acc`` and
``val/acc@<bucket>`` (``test/...`` in ``cli.py test``). The synthetic configs (``configs/synthetic/*.yaml``)
add it; the buckets are the data module's (``SyntheticDataModule.bucket_names`` and ``task.bucket_of``).
"""
from __future__ import annotations

import torch
from lightning.pytorch.callbacks import Callback
from torchmetrics import Metric

from ..data.synthetic import IGNORE


class AccuracyByDistance(Metric):
    """The share of answers predicted right, over every answer (``acc``) and per distance bucket
    (``acc@<name>``). Answers outside every bucket count in ``acc`` only. A value without an answer to
    count is NaN. The states are counts, summed over ranks in ``compute``.

    Args:
        bucket_names: one name per bucket index, in order (``2-15``, ``16-31``, ...).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, bucket_names: list[str], **kwargs):
        super().__init__(**kwargs)
        self.bucket_names = list(bucket_names)
        slots = len(self.bucket_names) + 1  # the last slot: answers outside every bucket
        self.add_state("correct", torch.zeros(slots, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(slots, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predictions: torch.Tensor, targets: torch.Tensor, bucket: torch.Tensor) -> None:
        """predictions, targets, bucket: (B, n); a target of -100 does not count, a bucket of -1 is none."""
        scored = targets != IGNORE
        outside = len(self.bucket_names)
        slot = torch.where(bucket >= 0, bucket, torch.full_like(bucket, outside))[scored]
        hit = (predictions == targets)[scored]
        self.total += torch.bincount(slot, minlength=outside + 1)
        self.correct += torch.bincount(slot[hit], minlength=outside + 1)

    def compute(self) -> dict[str, torch.Tensor]:
        correct, total = self.correct.float(), self.total.float()
        out = {"acc": correct.sum() / total.sum()}  # 0 / 0: NaN
        out.update({f"acc@{name}": correct[b] / total[b] for b, name in enumerate(self.bucket_names)})
        return out


class DistanceAccuracy(Callback):
    """Logs the answer accuracy of a synthetic recall task after each validation (``val/acc``, on the
    progress bar, and ``val/acc@<bucket>`` per key-query distance bucket) and test (``test/...``), from the
    predictions that ``LitLM`` returns for each labeled batch. Needs a data module with distance buckets
    (``SyntheticDataModule``). Computed on every rank (``compute`` is a collective); a value that no rank
    saw an answer for is not logged.

    ``keep_items=True`` also keeps, for the last validation or test on this rank, one record per answer in the
    order the data module yields them, ``(distance, correct)`` in ``items``, so that two models validated on
    the same data can be compared answer by answer (what ``study long-range`` stores and bootstraps), and in
    ``logps`` the log-probability the model gave each right answer (where ``LitLM`` returns it), in the same order.
    """

    #: the tags that go in TensorBoard's HPARAMS tab beside the module's own (``LitLM``)
    hparams_metrics = ("val/acc",)

    def __init__(self, keep_items: bool = False):
        self.metric: AccuracyByDistance | None = None
        self._bucket_of = None
        self.keep_items = keep_items
        self.items: list[tuple[int, bool]] = []
        self.logps: list[float] = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        dm = trainer.datamodule
        task = getattr(dm, "task", None)
        if not getattr(dm, "bucket_names", None) or not hasattr(task, "bucket_of"):
            raise ValueError(f"DistanceAccuracy scores the synthetic recall tasks by key-query distance, but the data "
                             f"module {type(dm).__name__} has no distance buckets; use it with "
                             "sa_lightning.data.SyntheticDataModule (configs/synthetic/*.yaml), or leave it out.")
        if self.metric is None or self.metric.bucket_names != list(dm.bucket_names):
            self.metric = AccuracyByDistance(dm.bucket_names)
        self._bucket_of = task.bucket_of

    # ---- scoring -------------------------------------------------------------------------------
    def _start(self, pl_module) -> None:
        self.metric.reset()
        self.metric.to(pl_module.device)
        self.items, self.logps = [], []

    def _update(self, outputs, batch) -> None:
        if not isinstance(outputs, dict) or "predictions" not in outputs:
            return  # no answer in this batch
        self.metric.update(outputs["predictions"], batch["labels"], self._bucket_of(batch["distance"]))
        if self.keep_items:  # a host read per batch: validation only, and only when asked
            scored = batch["labels"] != IGNORE
            hit = (outputs["predictions"] == batch["labels"])[scored]
            self.items += list(zip(batch["distance"][scored].tolist(), hit.tolist()))
            if "answer_logp" in outputs:
                self.logps += outputs["answer_logp"][scored].tolist()

    def _log(self, pl_module, stage: str, prog_bar: bool) -> None:
        values = self.metric.compute()
        self.metric.reset()
        for name, value in values.items():
            if not torch.isnan(value):
                pl_module.log(f"{stage}/{name}", value, prog_bar=prog_bar and name == "acc", sync_dist=False)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._start(pl_module)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._update(outputs, batch)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._log(pl_module, "val", prog_bar=True)

    def on_test_epoch_start(self, trainer, pl_module) -> None:
        self._start(pl_module)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._update(outputs, batch)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._log(pl_module, "test", prog_bar=False)
