"""Errors that end a command with one sentence and exit code 2 (engine.cli turns them into that).

UsageError is bad input. explain() names the known failures of a machine or a results folder (no space, no
permission, out of memory, a checkpoint that does not fit its run) in one sentence; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import errno
import traceback

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)
LOADERS = {"load_member", "load_weights", "load_models", "load_state_dict", "load_file", "safe_open"}  # frame names


class UsageError(Exception):
    """Bad input: the message says what is wrong and what to do."""


def _where(e: OSError) -> str:
    return f" ({e.filename})" if getattr(e, "filename", None) else ""


def _out_of_memory(e: BaseException) -> bool:
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (CUDA)
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def _in_checkpoint_loading(e: BaseException) -> bool:
    """Raised while a checkpoint's tensors were read or copied into a model (the frames say so)."""
    return any(frame.name in LOADERS for frame in traceback.extract_tb(e.__traceback__))


def explain(e: BaseException) -> str | None:
    """One sentence for a known failure, or None (a bug: let it show its traceback)."""
    if isinstance(e, UsageError):  # already a sentence (a diverged training, weights not kept, ...)
        return str(e)
    if isinstance(e, OSError) and e.errno in NO_SPACE:
        return (
            f"no space left on the device{_where(e)}; nothing half-written was kept: free some space (or pass "
            "--results on another disk) and run the command again (finished runs are cached)."
        )
    if isinstance(e, OSError) and e.errno in NO_PERMISSION:
        return (
            f"cannot write{_where(e)}: {(e.strerror or 'permission denied').lower()}; pick a results folder this "
            "user can write (--results or $LOOPSCOPE_RESULTS) or fix its permissions."
        )
    if _out_of_memory(e):
        return (
            "out of memory; train fewer seeds together (--group-size), use fewer --workers or a smaller preset, "
            "or free memory and run the command again (finished runs are cached)."
        )
    loading = isinstance(e, RuntimeError | ValueError) and _in_checkpoint_loading(e)
    if loading or type(e).__name__ == "SafetensorError":  # safetensors' own: a file that is not one
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return (
            f"a stored checkpoint is damaged or does not fit its run's config ({detail}); retrain that run with "
            "'loopscope train' (same config and seed) and run the command again."
        )
    return None
