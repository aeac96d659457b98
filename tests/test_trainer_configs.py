"""configs/trainer/ddp_4gpu.yaml and fsdp_4gpu.yaml take their logger and callbacks from shared config groups
(configs/trainer/logger/, configs/trainer/callbacks/), which LightningCLI's parser composes: a value that is a
file path (relative to the config that names it) is that file's content."""
from pathlib import Path

import pytest
import yaml

from sa_lightning.lit.cli import run

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "configs" / "trainer"
GPU_CONFIGS = ["ddp_4gpu", "fsdp_4gpu"]


def _printed(capsys, *args) -> dict:
    """The config ``cli.py fit ... --print_config`` prints: parsed and composed, nothing instantiated."""
    with pytest.raises(SystemExit) as stop:
        run(["fit", *map(str, args), "--print_config"])
    assert stop.value.code in (None, 0)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_the_gpu_trainer_configs_name_the_shared_groups(name):
    config = yaml.safe_load((TRAINER / f"{name}.yaml").read_text())
    assert config["logger"] == "logger/tensorboard.yaml" and config["callbacks"] == "callbacks/pretrain.yaml"
    assert (TRAINER / config["logger"]).is_file() and (TRAINER / config["callbacks"]).is_file()


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_the_groups_are_composed_into_the_parsed_trainer(name, capsys, tmp_path, monkeypatch):
    """As the README runs them (pretrain_360m.yaml, --trainer <gpu config>), from another working directory."""
    monkeypatch.chdir(tmp_path)
    printed = _printed(capsys, "--config", ROOT / "configs/pretrain_360m.yaml", "--trainer", TRAINER / f"{name}.yaml",
                       "--trainer.default_root_dir", tmp_path / "run")
    trainer = printed["trainer"]
    group = yaml.safe_load((TRAINER / "callbacks/pretrain.yaml").read_text())
    assert [c["class_path"] for c in trainer["callbacks"]] == [c["class_path"] for c in group]
    for parsed, shipped in zip(trainer["callbacks"], group):
        assert {k: parsed["init_args"][k] for k in shipped.get("init_args", {})} == shipped.get("init_args", {})
    logger = yaml.safe_load((TRAINER / "logger/tensorboard.yaml").read_text())
    assert trainer["logger"]["class_path"] == logger["class_path"] == "lightning.pytorch.loggers.TensorBoardLogger"
    # ${...default_root_dir} is the run folder of the composed config, after the command line
    assert trainer["logger"]["init_args"]["save_dir"] == str(tmp_path / "run")
    assert trainer["logger"]["init_args"]["name"] == "tb" and trainer["logger"]["init_args"]["default_hp_metric"] is False
    assert trainer["accumulate_grad_batches"] == 30 and trainer["precision"] == "bf16-mixed"


def test_the_ddp_and_fsdp_configs_share_everything_but_the_strategy():
    ddp, fsdp = (yaml.safe_load((TRAINER / f"{n}.yaml").read_text()) for n in GPU_CONFIGS)
    assert ddp.pop("strategy") == "ddp" and fsdp.pop("strategy")["class_path"].endswith("FSDPStrategy")
    assert ddp == fsdp


def test_the_paper_config_composes_its_trainer_file(capsys):
    """configs/pretrain_360m.yaml names trainer/ddp_4gpu.yaml, which names the groups: two levels of files."""
    trainer = _printed(capsys, "--config", ROOT / "configs/pretrain_360m.yaml")["trainer"]
    assert trainer["strategy"] == "ddp" and len(trainer["callbacks"]) == 7
    assert trainer["logger"]["init_args"]["save_dir"] == "runs/pretrain_360m"
