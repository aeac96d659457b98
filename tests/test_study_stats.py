"""The long-range study's statistics: each cell keeps its answers, accuracy beyond SWA's receptive field carries a
bootstrap interval, and compare.md pairs two variants answer by answer, worded from the interval."""
import random

from sa_lightning.eval.recall import beyond, beyond_interval, table
from sa_lightning.experiments.long_range import compare

BUCKETS = ["2-15", "16-31", "32-63", "64-127", "128-255"]


def _cell(variant: str, rate: float, seed: int = 0, items: bool = True, n: int = 500) -> dict:
    rng = random.Random(f"{variant}{rate}" + (f"s{seed}" if seed else ""))
    # the same validation set for every variant of one seed; each training seed draws its own
    distances = [random.Random(i + 1000 * seed).randint(2, 255) for i in range(n)]
    answers = [[d, int(rng.random() < (rate if d > 30 else 1.0))] for d in distances]
    buckets = {b: 0.5 for b in BUCKETS}
    scores = {1: {"acc": 0.5, "loss": 1.0, "buckets": buckets, **({"items": answers} if items else {})}}
    return dict(task="passkey", variant=variant, depth=2, window=16, seed=seed, seq_len=256, receptive_field=30,
                steps=10, train_seconds=1.0, scores=scores)


def test_beyond_counts_the_answers_past_the_receptive_field_with_an_interval():
    cell = _cell("sa", 0.6)
    far = [hit for d, hit in cell["scores"][1]["items"] if d >= 32]  # buckets wholly beyond L*(w-1) = 30
    assert beyond(cell, 1) == sum(far) / len(far)
    ci = beyond_interval(cell, 1)
    assert ci.items == len(far) and ci.lo < beyond(cell, 1) < ci.hi and ci.hi - ci.lo < 0.15
    text = table([cell])
    assert f"{100 * beyond(cell, 1):.1f} [" in text and "percentile bootstrap" in text
    old = _cell("sa", 0.6, items=False)  # a cell saved before answers were kept: the buckets' mean, no interval
    assert beyond(old, 1) == 0.5 and beyond_interval(old, 1) is None


def test_compare_words_each_verdict_from_the_paired_interval():
    cells = [_cell("sa", 0.9), _cell("random", 0.3), _cell("swa", 0.88), _cell("full", 0.9, items=False)]
    text = compare(cells, [{"a": "sa", "b": "random"}, {"a": "sa", "b": "swa"}, {"a": "full", "b": "swa"}])
    rows = [line for line in text.splitlines() if line.startswith("| passkey")]
    assert len(rows) == 2
    verdicts = [[c.strip() for c in r.strip(" |").split("|")][-3:-1] for r in rows]  # verdict, headroom
    assert "| sa | random |" in rows[0] and verdicts[0] == ["better", "–"]  # full kept no answers: control unknown
    assert "| sa | swa |" in rows[1] and verdicts[1] == ["not separable at this size", "–"]
    assert "Not compared" in text and "full against swa" in text  # no answers kept: said, not guessed
    # the positive control per cell: where full attention beats SWA beyond its field the row has headroom
    for swa_rate, room in ((0.2, "yes"), (0.95, "no")):
        cells = [_cell("sa", 0.9), _cell("random", 0.3), _cell("swa", swa_rate), _cell("full", 0.97)]
        text = compare(cells, [{"a": "sa", "b": "random"}])
        (line,) = [r for r in text.splitlines() if r.startswith("| passkey")]
        assert [c.strip() for c in line.strip(" |").split("|")][-2] == room, line


def test_compare_pools_the_training_seeds_with_each_seeds_own_difference():
    # SA ahead of Random by about 60 points at every seed; SA against SWA ahead at some seeds, behind at others
    rates = {"sa": (0.9,) * 6, "random": (0.3, 0.35, 0.25, 0.3, 0.28, 0.33),
             "swa": (0.6, 0.95, 0.8, 0.97, 0.7, 0.99), "full": (1.0,) * 6}
    cells = [_cell(v, r[s], seed=s) for v, r in rates.items() for s in range(6)]
    text = compare(cells, [{"a": "sa", "b": "random"}, {"a": "sa", "b": "swa"}])
    pooled, alone = text.split("## Each trained model alone")  # the rows that decide come first
    assert pooled.startswith("## Over training seeds: accuracy beyond")
    assert sum(line.startswith("| passkey") for line in alone.splitlines()) == 12  # one row per seed and comparison
    assert "| task | L | w | K | seed | A | B |" in alone and "| passkey | 2 | 16 | 1 | 2 | sa | random |" in alone
    table_rows = [[c.strip() for c in line.strip(" |").split("|")] for line in pooled.splitlines()
                  if line.startswith("| passkey") and line.count("|") == 13]
    rows = {r[5]: r for r in table_rows}
    assert set(rows) == {"random", "swa"}
    sa_random, sa_swa = rows["random"], rows["swa"]
    assert sa_random[6] == "6" and len(sa_random[8].split(", ")) == 6  # six seeds, each one's own difference
    assert sa_random[10] == "better" and sa_random[11] == "yes"  # full beats SWA at every seed: headroom
    assert sa_swa[10] == "not separable at this size"  # the seeds disagree
    assert "t interval over the seeds" in pooled and "Power (a paired t test over training seeds" in pooled
    summary = {r[4]: r for r in ([c.strip() for c in line.strip(" |").split("|")] for line in pooled.splitlines()
                                 if line.startswith("| passkey") and line.count("|") == 11)}
    assert summary["full"][9] == "6/6" and summary["random"][9] == "0/6"  # the seeds that reached 90%
    # three seeds: the range of their differences, and no verdict however far apart the sides are
    three = compare([c for c in cells if c["seed"] < 3], [{"a": "sa", "b": "random"}])
    (line,) = [r for r in three.split("## Each trained model alone")[0].splitlines()
               if r.startswith("| passkey") and r.count("|") == 13]
    assert "3 seeds: range [" in line and "| too few seeds to decide |" in line
    assert "Over training seeds" not in compare(cells[::6], [{"a": "sa", "b": "random"}])  # one seed: none


def test_the_answers_log_probability_is_a_second_outcome_with_an_equivalence_margin():
    """Where accuracy sits at chance on both sides, the answer's log-probability still ranks them; a margin turns
    a tight null into "equivalent within ±δ", never a wide one."""
    cells = []
    for s in range(16):  # an equivalence needs 16 seeds
        for variant, shift in (("sa", 0.0), ("random", 0.002 * (-1) ** s), ("swa", 0.0), ("full", 0.0)):
            cell = _cell(variant, 0.0 if variant != "full" else 1.0, seed=s)
            n = len(cell["scores"][1]["items"])
            cell["scores"][1]["logps"] = [-4.0 + shift + 0.01 * ((i * 7 + s) % 5) for i in range(n)]
            if variant == "full":
                cell["scores"][1]["logps"] = [-0.01] * n
            cells.append(cell)
    def sa_random(text):
        section = text.split("## Over training seeds: log p")[1].split("## Each trained model alone")[0]
        (line,) = [r for r in section.splitlines() if r.startswith("| passkey") and "| sa | random |" in r]
        return line

    text = compare(cells, [{"a": "sa", "b": "random"}], margins={"logp": 0.05})
    assert "## Over training seeds: log p(answer) beyond" in text
    # both arms sit at SWA's floor: equal by construction, so the floor rule says it cannot decide
    assert "cannot decide: the arms do not use their routes" in sa_random(text)
    assert "not fixed before this run's cells" in text  # no preregistered margin
    for cell in cells:  # SWA a nat below both arms: now they use their routes
        if cell["variant"] == "swa":
            cell["scores"][1]["logps"] = [lp - 1.0 for lp in cell["scores"][1]["logps"]]
    text = compare(cells, [{"a": "sa", "b": "random"}], margins={"logp": 0.05}, preregistered="in the test, first")
    assert "equivalent within ±0.050 nats" in sa_random(text)  # the margin in the table's own unit
    # beside it: its 90% interval, the fewest seeds whose removal undoes it, the leave-one-out range of the mean
    assert "; 90% [" in sa_random(text) and " undoes it; leaving one seed out, the mean runs " in sa_random(text)
    assert "fixed before the run: in the test, first" in text
    for cell in cells:  # seeds that disagree by ±0.2 nats: not separable, and not equivalent either
        if cell["variant"] == "random":
            cell["scores"][1]["logps"] = [lp + 0.2 * (-1) ** cell["seed"] for lp in cell["scores"][1]["logps"]]
    section = compare(cells, [{"a": "sa", "b": "random"}], margins={"logp": 0.05}).split(
        "## Over training seeds: log p")[1].split("## Each trained model alone")[0]
    (line,) = [r for r in section.splitlines() if r.startswith("| passkey") and "| sa | random |" in r]
    assert "not separable at this size" in line


def test_the_table_names_the_seed_where_several_were_trained():
    one = table([_cell("sa", 0.9)])
    assert "| seed |" not in one
    several = table([_cell("sa", 0.9, seed=s) for s in range(2)])
    assert "| variant | seed | K |" in several and "| sa | 1 | 1 |" in several


def test_sigma_seeds_average_each_answer_and_their_spread_is_shown_apart():
    """At K = 1 a model that draws is validated once per σ seed: each answer counts as its mean over them, and
    table.md and the pooled comparison show the σ seeds' spread beside the training seeds'."""
    from sa_lightning.eval.recall import beyond_by_eval_seed, mean_of_runs, sigma_sd

    def run(seed: int, rate: float) -> dict:
        cell = _cell("sa", rate, seed=0)
        return {**cell["scores"][1], "acc": rate, "loss": 1.0 - rate}

    runs = [run(0, 0.9), run(0, 0.5)]
    merged = mean_of_runs(runs)
    assert merged["acc"] == 0.7 and len(merged["hits_by_eval_seed"]) == 2
    assert [d for d, _ in merged["items"]] == [d for d, _ in runs[0]["items"]]
    assert all(h == (a[1] + b[1]) / 2 for (_, h), a, b in zip(merged["items"], runs[0]["items"], runs[1]["items"]))
    assert mean_of_runs(runs[:1]) is runs[0]  # validated once: as before, no per-seed answers
    cell = {**_cell("sa", 0.9), "scores": {1: merged}}
    per_seed = beyond_by_eval_seed(cell, 1)
    assert len(per_seed) == 2 and abs(sum(per_seed) / 2 - beyond(cell, 1)) < 1e-9
    swa = _cell("swa", 0.5)
    assert abs(sigma_sd(cell, 1) - abs(per_seed[0] - per_seed[1]) / 2 ** 0.5) < 1e-9
    assert sigma_sd(swa, 1) is None and beyond_by_eval_seed(swa, 1) is None  # validated once
    assert "σ SD" in table([cell, swa]) and "(2 σ)" in table([cell, swa])
    cells = [{**c, "seed": s} for s in range(2) for c in (cell, swa, _cell("full", 1.0))]
    alone = compare(cells, [{"a": "sa", "b": "swa"}]).split("## Each trained model alone")[1]
    assert "σ SD" in table(cells) and "(2 σ)" in table(cells) and "evaluation σ seeds" in alone


def test_the_seeds_figure_draws_an_arm_of_one_seed_and_the_power_line_has_no_test_under_five(tmp_path):
    """A cell saved before log-probabilities were kept leaves that outcome with arms of one seed: drawn, not a
    crash that loses the report; a design of three seeds is said to allow no test, with what more seeds would do."""
    from sa_lightning.experiments.long_range import EXPERIMENT, LongRangeConfig

    cells = [_cell(v, r, seed=s) for s in range(3) for v, r in (("sa", 0.9), ("random", 0.4), ("swa", 0.1),
                                                                ("full", 1.0))]
    for c in cells:
        if c["seed"] == 0:
            c["scores"][1]["logps"] = [-0.5] * len(c["scores"][1]["items"])
    cfg = LongRangeConfig(tasks=["passkey"], variants=["sa", "random", "swa", "full"], depths=[2], windows=[16],
                          seeds=[0, 1, 2])
    EXPERIMENT.report(cfg, cells, tmp_path).figures["over_seeds.png"](tmp_path / "seeds.png")
    assert (tmp_path / "seeds.png").stat().st_size > 1000
    text = compare(cells, [{"a": "sa", "b": "random"}], margins={"acc": 0.05})
    assert "with its 3 seeds no test is possible" in text and "10 seeds" in text and "needs" in text


def test_a_model_that_draws_nothing_appears_at_k_1_only():
    """SWA and full attention are validated once (K = 1) and stand in at K = 4 only as SA's B side: no row of their
    own is repeated at K = 4, and no comparison whose A is one of them."""
    cells = []
    for s in range(5):
        for variant, rate in (("sa", 0.5), ("swa", 0.1), ("full", 1.0)):
            cell = _cell(variant, rate, seed=s)
            if variant == "sa":
                cell["scores"][4] = {**cell["scores"][1]}
            cells.append(cell)
    text = compare(cells, [{"a": "sa", "b": "swa"}, {"a": "full", "b": "swa"}])
    over, alone = text.split("## Each trained model alone")
    rows = [[c.strip() for c in line.strip(" |").split("|")] for line in alone.splitlines()
            if line.startswith("| passkey")]
    assert sorted({(r[3], r[5], r[6]) for r in rows}) == [("1", "full", "swa"), ("1", "sa", "swa"), ("4", "sa", "swa")]
    summary = [[c.strip() for c in line.strip(" |").split("|")] for line in over.splitlines()
               if line.startswith("| passkey") and line.count("|") == 11]
    assert sorted((r[3], r[4]) for r in summary) == [("1", "full"), ("1", "sa"), ("1", "swa"), ("4", "sa")]
