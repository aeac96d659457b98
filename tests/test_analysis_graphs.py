"""The paper's graph analyses (connectome, spectrum, small world) and the SA+SWA gate readings, each on a
case small enough to check by hand."""
import csv
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from sa_lightning.analysis import analyze, gates, graphs
from sa_lightning.lit.callbacks import GateMeanLogger
from sa_lightning.attention import AttentionSpec
from sa_lightning.models import ModelConfig, Transformer


def _rows(path):
    return list(csv.DictReader(path.open()))


# ---- small world ---------------------------------------------------------------------------------
def test_ring_lattice_has_the_textbook_clustering_and_path_length():
    # Appendix A's circular SWA with n=20, w=5 links each token to 2 neighbours per side: a ring lattice, k=4
    adj = graphs.undirected(graphs.layer_stack("swa", 20, 5, 1, convention="theory")[0])
    assert adj.nnz / 20 == 4
    assert graphs.clustering_coefficient(adj) == pytest.approx(graphs.ring_lattice_clustering(4)) == 0.5
    # hops to the others: ceil(d / 2) for circular distance d = 1..9 (twice each) and 10 (once): 55 / 19
    length, connected = graphs.path_length(adj)
    assert length == pytest.approx(55 / 19) and connected == 1.0
    # one SA layer is the same lattice with its tokens relabelled: the same C and L
    sa = graphs.undirected(graphs.layer_stack("sa", 20, 5, 1, convention="theory", seed=3)[0])
    assert graphs.clustering_coefficient(sa) == pytest.approx(0.5)
    assert graphs.path_length(sa)[0] == pytest.approx(55 / 19)


def test_small_world_rows_put_sa_paths_near_random_and_swa_far():
    rows = {(r["scope"], r["graph"]): r for r in graphs.small_world(256, 8, 3, progress=lambda _: None)}
    swa, sa_stack, mixed = rows["stack", "swa"], rows["stack", "sa"], rows["layer", "sa_swa"]
    assert swa["path_length"] > 5 * swa["path_length_random"]  # a lattice: about n / (2k) hops
    assert sa_stack["path_length"] < 1.3 * sa_stack["path_length_random"]
    # SA+SWA in one layer: the lattice's clustering survives next to random-graph path lengths
    assert mixed["clustering"] > 3 * mixed["clustering_random"] and mixed["sigma"] > 1
    assert rows["layer", "sa"]["clustering"] == pytest.approx(rows["layer", "swa"]["clustering"])


# ---- connectome ----------------------------------------------------------------------------------
def test_band_statistics_by_hand():
    assert graphs.band_fraction_random(5, 1) == pytest.approx(4 / 10)  # 4 of the 10 pairs are neighbours
    # a path 0-1-2-3 laid out in the order 0, 2, 1, 3: spans 2, 1, 2
    path = graphs.undirected(np.eye(4, k=-1, dtype=bool))
    stats = graphs.band_statistics(path, band=1, order=np.array([0, 2, 1, 3]))
    assert stats == {"bandwidth": 2, "band_fraction": pytest.approx(1 / 3), "mean_span": pytest.approx(5 / 3 / 4)}


def test_connectome_swa_stays_banded_and_sa_spreads():
    n, w = 256, 16
    result = graphs.connectome(n, w, 4)
    swa, sa = result["swa"], result["sa"]
    # the causal SWA band |i - j| <= w - 1 is already RCM-optimal
    assert swa["raw"]["bandwidth"] == swa["rcm"]["bandwidth"] == w - 1 and swa["rcm"]["band_fraction"] == 1.0
    assert sa["rcm"]["bandwidth"] > n // 2
    assert sa["raw"]["band_fraction"] == pytest.approx(graphs.band_fraction_random(n, w), abs=0.03)
    assert not np.triu(sa["mask"], 1).any()  # causal: query i never reads a key j > i


# ---- spectrum ------------------------------------------------------------------------------------
def test_sa_is_swa_conjugated_by_its_permutation():
    n, w = 32, 7
    sa = graphs.layer_stack("sa", n, w, 1, convention="theory", seed=5)[0]
    swa = graphs.layer_stack("swa", n, w, 1, convention="theory")[0]
    from sa_lightning.attention import layer_generator, sample_permutation

    perm = sample_permutation(n, generator=layer_generator(5, 0)).numpy()  # slot s holds token perm[s]
    assert (sa[perm][:, perm] == swa).all()
    ev_sa = graphs.operator_eigenvalues(graphs.mixing_operator(sa)).real
    ev_swa = graphs.operator_eigenvalues(graphs.mixing_operator(swa)).real
    np.testing.assert_allclose(np.sort(ev_sa), np.sort(ev_swa), atol=1e-12)


def test_circulant_second_eigenvalue_and_its_powers():
    # n=8, w=3: each row averages 3 neighbours, lambda_k = (1 + 2 cos(2 pi k / 8)) / 3; k=1 gives (1 + sqrt 2) / 3
    assert graphs.circulant_lambda2(8, 3) == pytest.approx((1 + math.sqrt(2)) / 3)
    ops = graphs.layer_operators("swa", 8, 3, 3, convention="theory")
    assert graphs.operator_eigenvalues(ops[0])[1].real == pytest.approx((1 + math.sqrt(2)) / 3)
    curve = graphs.mixing_curve(ops, causal=False)
    for row in curve:
        assert row["sigma2"] == pytest.approx(((1 + math.sqrt(2)) / 3) ** row["layers"], rel=1e-6)


def test_sa_mixes_in_few_layers_swa_does_not():
    sa = graphs.mixing_curve(graphs.layer_operators("sa", 256, 16, 4, convention="theory"), causal=False)
    swa = graphs.mixing_curve(graphs.layer_operators("swa", 256, 16, 4, convention="theory"), causal=False)
    assert sa[0]["sigma2"] == pytest.approx(swa[0]["sigma2"])  # one layer: the same spectrum
    assert sa[-1]["sigma2"] < 0.1 < 0.9 < swa[-1]["sigma2"]
    assert sa[-1]["tv_to_uniform"] < 0.1 < 0.5 < swa[-1]["tv_to_uniform"]


def test_causal_operators_are_triangular_with_eigenvalues_one_over_degree():
    # causal SWA, n=6, w=3: queries 0, 1, 2.. read 1, 2, 3, 3, 3, 3 keys
    op = graphs.layer_operators("swa", 6, 3, 1, convention="causal")[0]
    np.testing.assert_allclose(graphs.operator_eigenvalues(op).real, [1, 1 / 2, 1 / 3, 1 / 3, 1 / 3, 1 / 3])


def test_analyze_commands_write_csv_and_png(tmp_path, capsys):
    for name in ("connectome", "spectrum", "small-world"):
        analyze.main([name, "--n", "64", "--window", "8", "--layers", "3", "--out", str(tmp_path)])
    for stem in ("connectome", "spectrum", "small_world"):
        assert (tmp_path / f"{stem}.png").stat().st_size > 5000 and _rows(tmp_path / f"{stem}.csv")
    connectome = {(r["graph"], r["order"]): r for r in _rows(tmp_path / "connectome.csv")}
    assert connectome["swa", "rcm"]["bandwidth"] == "7" and connectome["swa", "rcm"]["convention"] == "causal"
    assert len(_rows(tmp_path / "spectrum_eigenvalues.csv")) == 3 * 64
    assert "max |sorted eig(SA) - sorted eig(SWA)|" in capsys.readouterr().out


# ---- gates ---------------------------------------------------------------------------------------
def _tiny_sa_swa(biases: dict[tuple[int, str], float] | None = None) -> Transformer:
    """A 2-layer SA+SWA model whose gates are constant: zero weights (sigmoid(0) = 0.5), or zero weights
    plus a known bias b, so that every gate reads sigmoid(b)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=4096, n_layer=2, n_head=2, d_model=16, max_seq_len=32,
                                    attention=AttentionSpec("sa_swa", window=4))).eval()
    for layer, block in enumerate(model.blocks):
        for path in ("sa", "swa"):
            if biases is None:
                with torch.no_grad():
                    block.attn.gate.gates[path].weight.zero_()
                continue
            biased = nn.Linear(16, 16, bias=True)
            with torch.no_grad():
                biased.weight.zero_()
                biased.bias.fill_(biases[layer, path])
            block.attn.gate.gates[path] = biased
    return model


BIASES = {(0, "sa"): 0.0, (0, "swa"): math.log(3), (1, "sa"): -math.log(3), (1, "swa"): math.log(9)}
EXPECTED = {(0, "sa"): 0.5, (0, "swa"): 0.75, (1, "sa"): 0.25, (1, "swa"): 0.9}  # sigmoid(ln r) = r / (1 + r)


def test_gate_statistics_read_known_biases():
    model = _tiny_sa_swa(BIASES)
    sequences = [torch.randint(0, 4096, (24,), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    data = gates.collect(model, sequences, progress=lambda _: None)
    assert data[0]["sa"]["gate"].shape == (2, 2, 24)  # sequences, heads, queries
    for row in gates.summary_rows(data):
        assert row["mean"] == pytest.approx(EXPECTED[row["layer"], row["path"]])
        assert row["std"] == pytest.approx(0.0, abs=1e-6)
    for row in gates.distance_rows(data, model):
        if row["count"]:
            assert row["mean"] == pytest.approx(EXPECTED[row["layer"], row["path"]])
    # the read distance of SWA's first query is 0 (it reads only itself); of its last at most w - 1
    swa = data[1]["swa"]["distance"]
    assert (swa[..., 0] == 0).all() and (swa[..., -1] <= 3 + 1e-9).all()


def test_gates_command_on_a_checkpoint(tmp_path):
    model = _tiny_sa_swa()  # zero gate weights: every gate is exactly 0.5
    path = tmp_path / "tiny.ckpt"
    torch.save({"hyper_parameters": {"arch": model.cfg.to_dict()},
                "state_dict": {f"net.{k}": v for k, v in model.state_dict().items()}}, path)
    analyze.main(["gates", "--ckpt", str(path), "--tokens", "24", "--sequences", "2", "--out", str(tmp_path)])
    rows = _rows(tmp_path / "gates.csv")
    assert {(r["layer"], r["path"]) for r in rows} == {("0", "sa"), ("0", "swa"), ("1", "sa"), ("1", "swa")}
    assert all(float(r["mean"]) == pytest.approx(0.5) for r in rows)
    assert (tmp_path / "gates.png").stat().st_size > 10_000 and _rows(tmp_path / "gates_by_distance.csv")


def test_gates_command_refuses_a_single_path_model():
    model = Transformer(ModelConfig(vocab_size=256, n_layer=1, n_head=2, d_model=16, max_seq_len=16,
                                    attention=AttentionSpec("sa", window=4)))
    with pytest.raises(ValueError, match="needs an SA\\+SWA checkpoint"):
        gates.check_two_gates(model)


def test_gate_mean_logger_logs_the_known_means():
    model = _tiny_sa_swa(BIASES)
    written = []
    module = SimpleNamespace(net=model)
    trainer = SimpleNamespace(sanity_checking=False, global_step=4, world_size=1,
                              loggers=[SimpleNamespace(log_metrics=lambda m, step: written.append((step, m)))])
    callback = GateMeanLogger(every_n_steps=2)
    idx = torch.randint(0, 4096, (2, 16), generator=torch.Generator().manual_seed(0))
    callback.on_validation_epoch_start(trainer, module)
    with torch.no_grad():
        model(idx)
        model(idx[:1])
    callback.on_validation_epoch_end(trainer, module)
    step, metrics = written[-1]
    assert step == 4 and metrics == pytest.approx({f"gates/{p}_layer{layer}": v for (layer, p), v in EXPECTED.items()})
    callback.on_train_batch_start(trainer, module, idx, 0)
    with torch.no_grad():
        model(idx)
    trainer.global_step = 5  # the optimizer step has run by on_train_batch_end
    callback.on_train_batch_end(trainer, module, None, idx, 0)
    step, metrics = written[-1]
    assert step == 4
    assert metrics == pytest.approx({f"gates_train/{p}_layer{layer}": v for (layer, p), v in EXPECTED.items()})
    trainer.global_step = 4
    callback.on_train_batch_start(trainer, module, idx, 1)  # the same optimizer step again: read once
    assert not callback._handles
    with torch.no_grad():
        model(idx)  # no hooks remain: nothing accumulates
    assert callback._sums == {}
