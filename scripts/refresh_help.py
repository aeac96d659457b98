"""Write the help texts the package ships (``sa_lightning/help/``): ``python scripts/refresh_help.py``.

The commands whose parser needs Lightning (``fit``, ``validate``, ``test``, ``predict``, ``prepare``) spend 5-7 s
importing it before they can print ``--help``. Each text is kept with its key (the versions of Python and the parsers'
libraries, and the bytes of every package file the parser imported), so a fresh clone with the tested versions
prints it at once; any change to one of those files or versions makes it stale, and the parser prints the help
again. Run this after changing a file the CLI's parser reads (the suite's ``test_shipped_help_is_current`` says
which command is stale), in the tested environment (README's install), at the default width of 80 columns.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.pop("SA_LIGHTNING_CACHE", None)  # this process's _help_files: the default cache, as the children's
from sa_lightning.main import CACHED_HELP, SHIPPED_HELP, _help_files  # noqa: E402


def main() -> None:
    shipped = ROOT / "sa_lightning" / SHIPPED_HELP
    shipped.mkdir(exist_ok=True)
    # the default cache folder (the help shows it), and the parser's own text, kept in that cache, then shipped
    env = {k: v for k, v in os.environ.items() if k != "SA_LIGHTNING_CACHE"}
    env.update({"SA_LIGHTNING_HELP": "live", "COLUMNS": "80", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    for name in CACHED_HELP:
        print(f"{name} --help ...", flush=True)
        subprocess.run([sys.executable, str(ROOT / "cli.py"), name, "--help"], env=env, cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        shutil.copyfile(_help_files(name)[1], shipped / f"{name}.txt")
        print(f"  wrote {(shipped / f'{name}.txt').relative_to(ROOT)}", flush=True)


if __name__ == "__main__":
    main()
