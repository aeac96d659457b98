"""What a resumed run may and may not change.

- ``--ckpt_path last`` means the newest checkpoint that can be read anywhere under
  ``trainer.default_root_dir`` (``last.ckpt``, SLURM's ``hpc_ckpt``, or a periodic ``stepN.ckpt``),
  whatever logger version wrote it; a newer file that cannot be read (a save cut short on a file system
  without atomic renames, a copy gone wrong) is skipped with one line. The resumed run logs into the
  checkpoint's version, so TensorBoard shows one continuing run.
- A model setting the user gave that differs from the checkpoint's is refused, never dropped.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..models.checkpoint import checkpoint_candidates

#: model keys a resumed run takes from the user, not the checkpoint: they change neither the weights'
#: meaning nor the optimizer's state (averaging over permutations, compilation, the kernel implementation)
USER_WINS_ON_RESUME = ("eval_samples", "compile", "arch.attention.backend")
#: linked from the data's tokenizer after parsing, so the parsed value says nothing about the user
NOT_COMPARED = ("arch.vocab_size",)
#: keys set through another flag, named by that flag in messages
FLAG_OF = {"arch.seed": "seed_everything"}


def find_last_checkpoint(*roots: str | os.PathLike, readable=None) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest checkpoint under ``roots`` that ``readable`` accepts, [(newer file skipped, why)]).

    ``readable(path)`` raises ``ValueError`` for a file that cannot be read; None accepts every file.
    """
    skipped = []
    for path in checkpoint_candidates(*roots):
        try:
            if readable is not None:
                readable(path)
        except ValueError as err:
            skipped.append((path, str(err)))
            continue
        return path, skipped
    return None, skipped


def flatten(tree, prefix: str = "") -> dict:
    """{"arch": {"attention": {"window": 32}}} -> {"arch.attention.window": 32}; tuples become lists so YAML and checkpoints compare."""
    out = {}
    for key, value in (tree or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def conflicts(user: dict, defaults: dict, saved: dict, named: set[str]) -> list[tuple[str, object, object]]:
    """(key, user's value, checkpoint's value) for each model key the user set (it differs from the parser's
    default or is named on the command line) that the checkpoint holds with another value. All flat dicts."""
    found = []
    for key, value in user.items():
        if key in NOT_COMPARED or key in USER_WINS_ON_RESUME or key not in saved:
            continue
        user_set = key in named or not _same(value, defaults.get(key, object()))
        if user_set and not _same(value, saved[key]):
            found.append((key, value, saved[key]))
    return found


def conflict_message(path, found: list[tuple[str, object, object]]) -> str:
    """One sentence: the clashing keys with both values, and the three ways out."""
    def flag(key):
        return FLAG_OF.get(key, f"model.{key}")

    ours = ", ".join(f"{flag(k)}={u!r}" for k, u, _ in found)
    theirs = ", ".join(f"{flag(k)}={s!r}" for k, _, s in found)
    return (f"this command sets {ours}, but the checkpoint {str(path)!r} was trained with {theirs}, and a resumed "
            f"run keeps the checkpoint's model: drop those settings to resume it as it was, drop --ckpt_path to "
            f"start a new run with them, or replace --ckpt_path with --model.init_weights {path} to start a new run "
            f"from its weights.")


def named_model_keys(argv: list[str]) -> set[str]:
    """Model keys written out on the command line (``--model.arch.attention.window 64`` -> ``arch.attention.window``)."""
    keys = set()
    for arg in argv:
        if arg.startswith("--model.") and not arg.startswith("--model.init_args."):
            keys.add(arg[len("--model."):].split("=", 1)[0])
    return keys
