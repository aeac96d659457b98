"""Answer accuracy by key-query distance (sa_lightning/lit/accuracy.py): a torchmetrics metric held by the
DistanceAccuracy callback that the synthetic configs add; LitLM itself knows no buckets."""
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from torchmetrics.aggregation import MeanMetric

from sa_lightning.data.synthetic import IGNORE, SyntheticDataModule
from sa_lightning.lit import DistanceAccuracy, LitLM
from sa_lightning.lit.accuracy import AccuracyByDistance

ROOT = Path(__file__).resolve().parents[1]


def test_the_metric_gives_what_a_mean_over_each_selection_gave():
    """The values LitLM logged before, from one MeanMetric over all answers and one per bucket."""
    gen = torch.Generator().manual_seed(0)
    names = ["2-15", "16-31", "32-63"]
    metric, overall, per_bucket = AccuracyByDistance(names), MeanMetric(), [MeanMetric() for _ in names]
    for _ in range(3):
        targets = torch.randint(0, 5, (4, 20), generator=gen)
        targets[torch.rand(4, 20, generator=gen) < 0.7] = IGNORE
        predictions = torch.randint(0, 5, (4, 20), generator=gen)
        bucket = torch.randint(-1, 2, (4, 20), generator=gen)  # -1: outside every bucket; bucket 2 never seen
        metric.update(predictions, targets, bucket)
        scored, hit = targets != IGNORE, (predictions == targets).float()
        overall.update(hit[scored], weight=1.0)
        for b, m in enumerate(per_bucket):
            m.update(hit[scored & (bucket == b)], weight=1.0)
    values = metric.compute()
    assert list(values) == ["acc", "acc@2-15", "acc@16-31", "acc@32-63"]
    assert values["acc"] == overall.compute()
    assert values["acc@2-15"] == per_bucket[0].compute() and values["acc@16-31"] == per_bucket[1].compute()
    assert torch.isnan(values["acc@32-63"])  # no answer in that bucket: not logged


def _module_and_data():
    dm = SyntheticDataModule(task="passkey", seq_len=32, batch_size=4, train_examples=8, val_examples=12)
    from sa_lightning.models import ModelConfig

    torch.manual_seed(0)  # the same weights on every call
    return LitLM(arch=ModelConfig.from_name("debug", vocab_size=dm.vocab_size, max_seq_len=32)), dm


def _validate(callbacks):
    model, dm = _module_and_data()
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks)
    return model, dm, trainer.validate(model, datamodule=dm, verbose=False)[0]


def test_the_callback_logs_val_acc_by_distance_and_litlm_alone_logs_loss_only():
    model, dm, metrics = _validate([DistanceAccuracy()])
    # the model's own predictions, scored by hand with the data module's buckets
    hits, totals = torch.zeros(len(dm.bucket_names)), torch.zeros(len(dm.bucket_names))
    model.eval()
    with torch.no_grad():
        for i, batch in enumerate(dm.val_dataloader()):
            predictions = model.eval_scores(model.targets_of(batch)[0], -1 - i).argmax(-1)  # validation's stream
            scored = batch["labels"] != IGNORE
            bucket = dm.task.bucket_of(batch["distance"])
            for b in range(len(dm.bucket_names)):
                sel = scored & (bucket == b)
                hits[b] += (predictions == batch["labels"])[sel].sum()
                totals[b] += sel.sum()
    assert metrics["val/acc"] == pytest.approx(float(hits.sum() / totals.sum()))
    for b, name in enumerate(dm.bucket_names):
        if totals[b]:
            assert metrics[f"val/acc@{name}"] == pytest.approx(float(hits[b] / totals[b]))
        else:
            assert f"val/acc@{name}" not in metrics
    _, _, alone = _validate([])
    assert "val/loss" in alone and not any(k.startswith("val/acc") for k in alone)
    assert alone["val/loss"] == pytest.approx(metrics["val/loss"])
    assert not hasattr(model, "bucket_names") and not hasattr(model, "bucket_acc")


def test_the_callback_refuses_data_without_distance_buckets():
    trainer = SimpleNamespace(datamodule=L.LightningDataModule())
    with pytest.raises(ValueError, match="has no distance buckets"):
        DistanceAccuracy().setup(trainer, None, "fit")


@pytest.mark.parametrize("task", ["mqar", "passkey"])
def test_the_synthetic_configs_add_the_callback(task):
    config = yaml.safe_load((ROOT / f"configs/synthetic/{task}.yaml").read_text())
    assert {"class_path": "sa_lightning.lit.DistanceAccuracy"} in config["trainer"]["callbacks"]


def test_kept_items_are_each_answer_in_order_and_give_the_logged_accuracy():
    """``keep_items=True``: one (distance, correct) per scored answer, in batch order, reset per validation; their
    mean is ``val/acc`` (what ``study long-range`` stores to pair two models answer by answer)."""
    gen = torch.Generator().manual_seed(1)
    callback = DistanceAccuracy(keep_items=True)
    callback.metric, callback._bucket_of = AccuracyByDistance(["2-15", "16-31"]), lambda d: torch.clamp(d // 16, max=1)
    module = SimpleNamespace(device=torch.device("cpu"))
    want = []
    for epoch in range(2):
        callback._start(module)
        want = []
        for _ in range(3):
            labels = torch.full((4, 20), IGNORE)
            labels[:, -1] = torch.randint(0, 5, (4,), generator=gen)
            distance = torch.zeros(4, 20, dtype=torch.long)
            distance[:, -1] = torch.randint(2, 32, (4,), generator=gen)
            predictions = torch.randint(0, 5, (4, 20), generator=gen)
            callback._update({"predictions": predictions}, {"labels": labels, "distance": distance})
            want += list(zip(distance[:, -1].tolist(), (predictions[:, -1] == labels[:, -1]).tolist()))
    assert callback.items == want  # the second validation's answers only
    assert sum(hit for _, hit in callback.items) / len(callback.items) == pytest.approx(float(callback.metric.compute()["acc"]))
