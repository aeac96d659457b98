"""``cli.py export`` and every folder-writing command: nothing a user had is lost (issue 33).

The folder is built beside its target and renamed into place; a folder that holds files is replaced only with
``--overwrite``; an empty, root, home or current ``--out`` is refused; a full disk leaves the old folder whole."""
import errno
import os
import stat

import pytest

from sa_lightning.utils import atomic
from tests.helpers import run_cli_here


def _model():
    from sa_lightning.models import ModelConfig, build_model

    return build_model(ModelConfig.from_name("debug"))


@pytest.mark.parametrize("out, said", [
    ("", "--out is empty (an unset shell variable?)"),
    ("/", "which holds more than this output"),
    (".", "which holds more than this output"),
    ("~", "which holds more than this output"),
])
def test_an_empty_root_home_or_current_out_is_refused_before_the_checkpoint_is_read(out, said):
    res = run_cli_here("export", "--ckpt", "no/such.ckpt", "--out", out, "--overwrite")
    assert res.returncode != 0 and said in res.stderr.strip().splitlines()[-1]


def test_a_folder_that_holds_files_is_replaced_only_with_overwrite(tmp_path):
    from sa_lightning.models.export import export

    out = tmp_path / "model"
    out.mkdir()
    (out / "README.md").write_text("the user's own file")
    res = run_cli_here("export", "--ckpt", "no/such.ckpt", "--out", str(out))
    assert res.returncode != 0 and "already holds files; pass --overwrite" in res.stderr
    assert (out / "README.md").read_text() == "the user's own file"
    with pytest.raises(ValueError, match="holds files that `cli.py export` did not write; --overwrite replaces only"):
        export(_model(), out, overwrite=True)  # a folder of the user's own: never replaced, --overwrite or not
    assert (out / "README.md").read_text() == "the user's own file"
    (out / "README.md").unlink()
    export(_model(), out)
    export(_model(), out, overwrite=True)  # an earlier export's folder: replaced
    assert (out / "config.json").is_file()
    assert (out / atomic.OWNER).read_text().splitlines()[:2] == ["export", "README.md"]  # the command, its files
    assert str(out.resolve()) in (out / "README.md").read_text()  # the card names the folder's path
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    mode = stat.S_IMODE((out / "model.safetensors").stat().st_mode)
    assert mode & 0o044 == 0o044 & ~atomic._umask(), oct(mode)  # readable by colleagues unless the umask says no


def test_overwrite_never_replaces_the_run_folder_it_exports_from(tmp_path):
    """Issue 48: ``export --ckpt RUN/tb/version_0/checkpoints/last.ckpt --out RUN --overwrite`` replaced the whole
    run folder, the checkpoint it read, the other checkpoints and the TensorBoard logs, and exited 0."""
    import torch

    run = tmp_path / "run"
    ckpts = run / "tb" / "version_0" / "checkpoints"
    ckpts.mkdir(parents=True)
    torch.save({"state_dict": {}}, ckpts / "last.ckpt")
    (ckpts / "step=10.ckpt").write_bytes(b"x")
    (run / "tb" / "version_0" / "events.out.tfevents.1").write_bytes(b"logs")
    before = sorted(str(p) for p in run.rglob("*"))
    res = run_cli_here("export", "--ckpt", str(ckpts / "last.ckpt"), "--out", str(run), "--overwrite")
    assert res.returncode != 0 and "the input being read; --overwrite never replaces it" in res.stderr.splitlines()[-1]
    assert sorted(str(p) for p in run.rglob("*")) == before
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}}, other)
    res = run_cli_here("export", "--ckpt", str(other), "--out", str(run), "--overwrite")
    assert res.returncode != 0 and "holds the checkpoint" in res.stderr.splitlines()[-1]
    assert sorted(str(p) for p in run.rglob("*")) == before


def test_a_full_disk_leaves_the_previous_export_whole_and_says_so_in_one_sentence(tmp_path, monkeypatch):
    from sa_lightning.models import export as export_module

    out = tmp_path / "model"
    export_module.export(_model(), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / ".model.partial" / "model.safetensors"))

    monkeypatch.setattr(export_module, "_write", full)
    with pytest.raises(atomic.WriteError, match=r"could not be written \(No space left on device\); nothing was "
                                                r"replaced, the previous exported model .* is intact"):
        export_module.export(_model(), out, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.parametrize("command", [("bench", "attention"), ("doctor", "--tiny"), ("analyze", "connection"),
                                     ("study", "long-range")])
def test_every_commands_out_refuses_an_empty_or_root_folder(command):
    for out, said in (("", "is empty (an unset shell variable?)"), ("/", "which holds more than this output")):
        res = run_cli_here(*command, "--out", out)
        assert res.returncode != 0 and said in res.stderr.strip().splitlines()[-1], res.stderr[-500:]


@pytest.mark.parametrize("command", [("sweep", "--config", "configs/sweep/tiny.yaml"),
                                     ("study", "long-range", "--config", "configs/study/long_range.yaml")])
def test_a_sweep_or_study_never_writes_into_a_folder_of_other_files(command, tmp_path):
    from tests.helpers import ROOT

    (tmp_path / "thesis.tex").write_text("the user's own file")
    args = [a if not a.startswith("configs/") else str(ROOT / a) for a in command]
    res = run_cli_here(*args, "--out", str(tmp_path))
    assert res.returncode != 0 and "holds other files and no" in res.stderr.strip().splitlines()[-1], res.stderr[-800:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.tex"]


@pytest.mark.slow
def test_an_analysis_never_replaces_a_users_file_of_the_same_name_without_overwrite(tmp_path):
    """Issue 48's output contract for every command that writes a set of files into a folder the user names: a
    file the project did not write there is kept unless --overwrite (the manifest ``.written_by.json`` records
    what each command wrote, so its own files are replaced on a rerun without asking)."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "connection.png").write_bytes(b"my figure")
    args = ("analyze", "connection", "--out", str(out), "--trials", "3")
    res = run_cli_here(*args)
    assert res.returncode != 0 and "holds 'connection.png', which the analysis would replace and no command of " \
        "this project wrote there" in res.stderr.strip().splitlines()[-1]
    assert (out / "connection.png").read_bytes() == b"my figure" and not (out / "connection.csv").exists()
    assert run_cli_here(*args, "--overwrite").returncode == 0
    assert (out / "connection.png").read_bytes() != b"my figure"
    assert run_cli_here(*args).returncode == 0  # its own files now: replaced without asking


def test_overwrite_keeps_a_file_the_user_added_to_an_exported_folder(tmp_path):
    from sa_lightning.models.export import export

    out = tmp_path / "model"
    export(_model(), out)
    (out / "my_eval.json").write_text("{}")
    with pytest.raises(ValueError, match=r"did not write \('my_eval.json'\); --overwrite replaces only a folder"):
        export(_model(), out, overwrite=True)
    assert (out / "my_eval.json").read_text() == "{}"
