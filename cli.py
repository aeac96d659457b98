#!/usr/bin/env python
"""sa_lightning's command line in a checkout; ``pip install -e .`` installs the same as ``sa-lightning``.

    python cli.py fit --config configs/tiny.yaml      (= sa-lightning fit --config configs/tiny.yaml)

The commands and their options: ``python cli.py --help``, or ``sa_lightning/main.py``.
"""
from sa_lightning.main import main_with_clean_errors

if __name__ == "__main__":
    main_with_clean_errors()
