"""What the README says TensorBoard shows, read back from the event files of a fit of the shipped
configs/tiny.yaml (its TensorBoard logger and callbacks as shipped, reduced in size only)."""
from pathlib import Path

import pytest

from sa_lightning.lit.cli import run

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--config", str(ROOT / "configs/tiny.yaml"), "--config", str(ROOT / "tests/configs/small.yaml")]
# no attention maps or zero-shot tasks: this test reads scalars and hparams only (tests/helpers.py)
LEAN = ['--trainer.callbacks+={"class_path": "tests.helpers.SkipUnusedWork"}']
# the README's tags; train/device/items_per_sec is TokenThroughput's (trained tokens/s), logged once its
# 20-step window is full
README_SCALARS = {"train/loss", "val/loss", "val/ppl", "val/unigram_ppl", "train/lr", "train/grad_norm",
                  "train/tokens", "train/device/items_per_sec"}


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = tmp_path_factory.mktemp("tb")
    cli = run(["fit", *BASE, *LEAN, "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "21",
               "--trainer.val_check_interval", "10", "--trainer.default_root_dir", str(root)])
    folder = root / "tb" / "version_0"
    assert folder.is_dir()
    return cli, EventAccumulator(str(folder), size_guidance={"tensors": 0}).Reload()


def test_every_scalar_the_readme_names_is_in_tensorboard(events):
    cli, acc = events
    tags = set(acc.Tags()["scalars"])
    assert README_SCALARS <= tags, sorted(README_SCALARS - tags)
    baseline = [e.value for e in acc.Scalars("val/unigram_ppl")]
    # logged beside val/ppl at every validation (steps 10 and 20), the data module's own value
    assert len(baseline) == 2 and baseline[0] == pytest.approx(cli.datamodule.unigram_perplexity(), rel=1e-6)
    assert [e.step for e in acc.Scalars("val/unigram_ppl")] == [e.step for e in acc.Scalars("val/ppl")]


def test_hparams_tab_holds_the_config_and_the_parameter_counts(events):
    from tensorboard.plugins.hparams import plugin_data_pb2

    cli, acc = events
    content = acc.PluginTagToContent("hparams")
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(content)
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    hp = {k: v.number_value if v.HasField("number_value") else v.string_value for k, v in start.hparams.items()}
    net = cli.model.net
    assert hp["params/total"] == net.num_parameters() > hp["params/non_embedding"] > 0
    assert hp["params/non_embedding"] == net.num_parameters(exclude_embedding=True)
    assert hp["tokens_per_step"] == 4 * 64
    # the config: the module's arguments (arch flattened) and the data's sequence length and batch size
    assert hp["lr"] == pytest.approx(3e-3) and hp["arch/d_model"] == 64 and hp["arch/n_layer"] == 2
    assert hp["arch/attention/variant"] == "sa_swa" and hp["data/seq_len"] == 64 and hp["data/batch_size"] == 4
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    metrics = {m.name.tag for m in experiment.metric_infos}
    assert {"val/loss", "val/ppl", "val/unigram_ppl", "train/loss"} <= metrics
    assert metrics <= set(acc.Tags()["scalars"])  # each column of the tab has scalars to read


def test_no_logger_and_a_csv_logger_still_fit(tmp_path):
    """logger: false (tests/configs/fast.yaml) and a logger without TensorBoard's hparams summary."""
    fast = ["--config", str(ROOT / "configs/tiny.yaml"), "--config", str(ROOT / "tests/configs/fast.yaml"),
            "--trainer.max_steps", "3", "--trainer.default_root_dir", str(tmp_path)]
    assert run(["fit", *fast]).trainer.global_step == 3
    csv = run(["fit", *fast, "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
               "--trainer.logger.init_args.save_dir", str(tmp_path / "csv")])
    folder = Path(csv.trainer.logger.log_dir)
    assert "params/total" in (folder / "hparams.yaml").read_text()
    assert "val/unigram_ppl" in (folder / "metrics.csv").read_text().splitlines()[0]
