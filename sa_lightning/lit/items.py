"""A trained ``LitLM`` scored item by item, the items a study pairs over training seeds: each validation block's NLL
(and, where the data plants repeats, the copies'), and a recall task's answers by key–query distance under K
permutations and σ seeds (``eval.recall`` reads them)."""
from __future__ import annotations

import math

from ..eval.recall import mean_of_runs


def score_recall(model, dm, accelerator: str, eval_samples: list[int], eval_seeds: list[int]) -> dict[int, dict]:
    """A recall model's scores per K (``eval.recall``'s record): validated once per K in ``eval_samples`` (once if
    it draws nothing). At K = 1 a model that draws answers under each σ seed of ``eval_seeds`` (``LitLM.eval_seed``;
    the first, 0, is validation's own draws), and an answer counts as its mean over them; each seed's answers are
    kept (``hits_by_eval_seed``). Larger K average K draws of the first seed."""
    import lightning as L

    from .accuracy import DistanceAccuracy

    accuracy = DistanceAccuracy(keep_items=True)
    trainer = L.Trainer(accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[accuracy])  # val/acc by distance, answer by answer
    draws = model.net.variant.draws
    scores = {}
    for k in eval_samples if draws else [1]:
        model.hparams.eval_samples = k
        runs = []
        for eval_seed in eval_seeds if draws and k == 1 else eval_seeds[:1]:
            model.eval_seed = eval_seed
            metrics = trainer.validate(model, datamodule=dm, verbose=False)[0]
            runs.append({"acc": metrics["val/acc"], "loss": metrics["val/loss"],
                         "buckets": {name: metrics.get(f"val/acc@{name}", math.nan) for name in dm.bucket_names},
                         # each answer in validation order, (distance, 1 if right): cells pair answer by answer
                         "items": [[d, int(hit)] for d, hit in accuracy.items],
                         # the log-probability of each right answer, in the same order: the continuous outcome
                         "logps": [round(x, 5) for x in accuracy.logps]})
        scores[k] = mean_of_runs(runs)
    model.eval_seed = 0
    return scores


def validation_items(model, dm, eval_seed: int = 0) -> dict[str, list[float]]:
    """Each validation block's mean NLL per token, in the validation order (``val_ppl``); where the data planted
    repeats (``data.repeats``), the text's tokens there and the copies' apart: their NLL (``repeat_nll``) and the
    share of them the model's top guess gets right (``repeat_acc``, the accuracy of recall). SA draws σ as
    validation does, from streams of its own for each ``eval_seed`` (0: validation's)."""
    import torch
    import torch.nn.functional as F

    from ..data.repeats import text_targets

    model.eval()
    model.eval_seed = eval_seed
    text, repeats, hits = [], [], []
    with torch.no_grad():
        for i, batch in enumerate(dm.val_dataloader()):
            inputs, targets = model.targets_of(batch)
            scores = model.eval_scores(inputs, model.val_stream(i)).float()
            nll = F.cross_entropy(scores.flatten(0, 1), targets.flatten(), reduction="none", ignore_index=-100)
            nll = nll.view(targets.shape)
            copy = batch["repeat"] if isinstance(batch, dict) and "repeat" in batch else None
            if copy is None:
                text += nll.mean(dim=1).tolist()
                continue
            plain = text_targets(batch)
            text += ((nll * plain).sum(dim=1) / plain.sum(dim=1)).tolist()
            repeats += ((nll * copy).sum(dim=1) / copy.sum(dim=1)).tolist()
            right = (scores.argmax(dim=-1) == targets) & copy
            hits += (right.sum(dim=1) / copy.sum(dim=1)).tolist()
    return {"val_ppl": text, **({"repeat_nll": repeats, "repeat_acc": hits} if repeats else {})}
