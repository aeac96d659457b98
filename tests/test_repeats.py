"""The language-model mix with planted repeats (data/repeats.py): a segment planted twice, the mask of the targets
only the copy predicts, fixed per validation block and fresh per training visit."""
import pytest
import torch

from sa_lightning.data.repeats import RepeatedBlocks, RepeatMix


def test_a_segment_is_planted_twice_and_the_mask_marks_the_targets_the_copy_predicts():
    mix = RepeatMix(length=8, gap=40)
    block = torch.arange(1000, 1065)  # n + 1 = 65 tokens of "text", none in the drawn range [16, 100)
    out, mask, made = mix.plant(block, seed=3, vocab=100)
    planted = (out != block).nonzero().flatten().tolist()
    p, q = planted[0], planted[0] + 40
    assert planted == list(range(p, p + 8)) + list(range(q, q + 8))
    assert torch.equal(out[p:p + 8], out[q:q + 8]) and bool(((out[p:p + 8] >= 16) & (out[p:p + 8] < 100)).all())
    # target t predicts token t + 1: the copy's tokens 2..8 are the targets q .. q + 6
    assert mask.shape == (64,) and mask.nonzero().flatten().tolist() == list(range(q, q + 7))
    # the other targets the planting made (the random first occurrence, the copy's first token) are not text either
    assert made.nonzero().flatten().tolist() == [t for t in list(range(p - 1, p + 7)) + [q - 1] if t >= 0]
    assert not bool((made & mask).any())
    assert torch.equal(mix.plant(block, seed=3, vocab=100)[0], out)  # a seed is one draw


def test_with_several_copies_only_the_last_is_scored_and_each_earlier_one_is_a_source():
    """copies = 3: the segment at p, p + gap, p + 2 gap and p + 3 gap; the last copy's targets are scored, the text
    between the occurrences stays text, and every other target the planting made is marked planted."""
    mix = RepeatMix(length=8, gap=32, copies=3)
    mix.check(seq_len=128, vocab=100)
    block = torch.arange(1000, 1129)
    out, mask, made = mix.plant(block, seed=5, vocab=100)
    planted = (out != block).nonzero().flatten().tolist()
    p = planted[0]
    starts = [p + j * 32 for j in range(4)]
    assert planted == [t for s in starts for t in range(s, s + 8)]
    assert all(torch.equal(out[s:s + 8], out[p:p + 8]) for s in starts)
    q = starts[-1]
    assert mask.nonzero().flatten().tolist() == list(range(q, q + 7))
    expected = {t for s in starts[:-1] for t in range(s - 1, s + 7) if t >= 0} | {q - 1}
    assert set(made.nonzero().flatten().tolist()) == expected and not bool((made & mask).any())
    text = ~(mask | made)
    assert bool(text[p + 8:p + 31].all())  # the text between two occurrences is text
    with pytest.raises(ValueError, match="do not fit a block"):
        RepeatMix(length=8, gap=41, copies=3).check(seq_len=128, vocab=100)
    with pytest.raises(ValueError, match="at most half its tokens"):
        RepeatMix(length=8, gap=32, copies=3, count=3).check(seq_len=128, vocab=100)


def test_validation_blocks_keep_their_segment_and_each_training_epoch_draws_anew():
    from sa_lightning.data.sampler import BlockSampler, EpochOffsetSampler

    blocks = [torch.arange(1000, 1065) + i for i in range(4)]
    val = RepeatedBlocks(blocks, RepeatMix(length=8, gap=40), vocab=100, seed=0, labeled=True)
    first = val[2]
    assert set(first) == {"tokens", "labels", "repeat", "planted"}
    assert torch.equal(first["labels"], first["tokens"][1:])
    assert torch.equal(val[2]["tokens"], first["tokens"]) and not torch.equal(val[1]["tokens"], first["tokens"])
    train = RepeatedBlocks(blocks, RepeatMix(length=8, gap=40), vocab=100, seed=0, labeled=False)
    sampler = EpochOffsetSampler(BlockSampler(4, seed=0))
    epoch0 = {i % 4: train[i] for i in sampler}
    sampler.set_epoch(1)
    epoch1 = {i % 4: train[i] for i in sampler}
    assert all(not torch.equal(epoch0[b], epoch1[b]) for b in range(4))  # fresh segments: nothing to memorise
    assert all(torch.equal(train[i], train[i]) for i in sampler)  # and the same on a resumed run


@pytest.mark.parametrize("kwargs, match", [({"length": 1}, "length >= 2"), ({"gap": 70}, "do not fit a block"),
                                           ({"low": 99}, "two ids")])
def test_a_mix_that_cannot_fit_is_refused_in_one_sentence(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RepeatMix(**{"length": 8, "gap": 40, **kwargs}).check(seq_len=64, vocab=100)


def test_the_data_module_scores_the_repeats_apart(monkeypatch):
    from sa_lightning.data import LMDataModule

    dm = LMDataModule(seq_len=64, batch_size=4, val_blocks=8, repeats={"length": 8, "gap": 40}, progress=False)
    dm.setup()
    batch = next(iter(dm.val_dataloader()))
    assert batch["tokens"].shape == (4, 65) and batch["repeat"].shape == (4, 64)
    assert batch["repeat"].sum(dim=1).tolist() == [7, 7, 7, 7] and not bool((batch["repeat"] & batch["planted"]).any())
    assert next(iter(dm.train_dataloader())).shape == (4, 65)  # training: plain blocks, every token a target
    with pytest.raises(ValueError, match="data repeats takes length, gap, low, count, alphabet, copies, gap_max"):
        LMDataModule(seq_len=64, repeats={"length": 8, "distance": 40})
    with pytest.raises(ValueError, match="set data.mode: cache"):
        LMDataModule(seq_len=64, mode="stream", repeats={"length": 8, "gap": 40})


def test_several_segments_are_planted_apart_each_copied_from_the_alphabet():
    mix = RepeatMix(length=6, gap=30, count=3, alphabet=10)
    block = torch.arange(1000, 1097)  # n + 1 = 97 tokens of "text"
    for seed in range(20):
        out, mask, made = mix.plant(block, seed=seed, vocab=100)
        changed = out != block
        assert int(changed.sum()) == 2 * 3 * 6  # six disjoint spans, none over another
        assert bool(((out[changed] >= 16) & (out[changed] < 26)).all())  # [low, low + alphabet)
        # every copy target predicts the token planted gap earlier's successor: the copy is the only way to it
        targets = mask.nonzero().flatten()
        assert len(targets) == 3 * 5 and torch.equal(out[targets + 1], out[targets + 1 - 30])
        assert not bool((made & mask).any())
    assert torch.equal(RepeatMix(length=8, gap=40, count=1).plant(torch.arange(1000, 1065), 3, 100)[0],
                       RepeatMix(length=8, gap=40).plant(torch.arange(1000, 1065), 3, 100)[0])


@pytest.mark.parametrize("kwargs, match", [({"count": 3}, "at most half its tokens"), ({"alphabet": 1}, "two ids"),
                                           ({"alphabet": 90}, "inside the vocabulary")])
def test_a_crowded_or_empty_mix_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RepeatMix(**{"length": 8, "gap": 40, **kwargs}).check(seq_len=64, vocab=100)


def test_validation_logs_the_copies_nll_and_the_texts_apart():
    """val/repeat_nll and val/text_loss: the token-weighted NLL over each mask, checked against the model's own scores;
    with the planted targets they make up val/loss."""
    import lightning as L
    import torch.nn.functional as F

    from sa_lightning.data import LMDataModule
    from sa_lightning.lit import LitLM
    from sa_lightning.models import ModelConfig

    dm = LMDataModule(seq_len=64, batch_size=4, val_blocks=8, repeats={"length": 8, "gap": 40, "count": 2},
                      progress=False)
    torch.manual_seed(0)
    model = LitLM(arch=ModelConfig.from_name("debug", vocab_size=len(dm.tokenizer), max_seq_len=64))
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    metrics = trainer.validate(model, datamodule=dm, verbose=False)[0]
    sums = {"repeat": [0.0, 0], "text": [0.0, 0], "all": [0.0, 0]}
    model.eval()
    with torch.no_grad():
        for i, batch in enumerate(dm.val_dataloader()):
            inputs, targets = model.targets_of(batch)
            nll = F.cross_entropy(model.eval_scores(inputs, model.val_stream(i)).transpose(1, 2), targets,
                                  reduction="none")
            for name, sel in (("repeat", batch["repeat"]), ("text", ~(batch["repeat"] | batch["planted"])),
                              ("all", torch.ones_like(batch["repeat"]))):
                sums[name][0] += float(nll[sel].sum())
                sums[name][1] += int(sel.sum())
    assert metrics["val/repeat_nll"] == pytest.approx(sums["repeat"][0] / sums["repeat"][1], rel=1e-4)
    assert metrics["val/text_loss"] == pytest.approx(sums["text"][0] / sums["text"][1], rel=1e-4)
    assert metrics["val/loss"] == pytest.approx(sums["all"][0] / sums["all"][1], rel=1e-4)
    assert sums["repeat"][1] == 8 * 2 * 7  # two copies of seven predictable targets in each of the eight blocks


def test_a_gap_range_draws_each_segments_own_gap_and_scores_the_value_of_each_key():
    """gap_max: every segment lies its own gap back, from gap to gap_max, and with length 2 (a key and its value)
    each scored target is the value whose key sits at the target's own position, planted that gap earlier."""
    mix = RepeatMix(length=2, gap=20, gap_max=50, count=6, alphabet=40)
    mix.check(seq_len=128, vocab=100)
    seen = set()
    for seed in range(30):
        block = torch.arange(1000, 1129)  # text ids far from the alphabet: a planted token is never text
        tokens, repeat, planted = mix.plant(block, seed, 100)
        scored = torch.nonzero(repeat).flatten()
        assert len(scored) == 6  # one value per key
        for t in scored.tolist():
            back = [d for d in range(20, 51) if tokens[t - d] == tokens[t] and tokens[t - d + 1] == tokens[t + 1]]
            assert back, "the key at t was planted, with its value after it, 20 to 50 tokens before"
            seen.update(back)
        assert ((tokens >= 1000) | (tokens < 56)).all()
    assert len(seen) > 15  # the gaps spread over the range, not one offset
    assert torch.equal(RepeatMix(length=8, gap=40).plant(torch.arange(1000, 1065), 3, 100)[0],
                       RepeatMix(length=8, gap=40, gap_max=None).plant(torch.arange(1000, 1065), 3, 100)[0])
    with pytest.raises(ValueError, match="gap_max=30 cannot be below gap=40"):
        RepeatMix(length=8, gap=40, gap_max=30).check(seq_len=128, vocab=100)
