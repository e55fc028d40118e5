"""Which per-change path runs: the compiled one or the pure-Python reference.

``tidemark._fastpath`` (Cython, built by ``pip install`` when a C compiler is there)
reads Insert/Update/Delete tuple data and turns buffered rows into Arrow buffers; the
decoder and ``writers.arrow_batch`` use it when it is importable and otherwise run
their own Python code, which stays the reference (a property test asserts both give
the same results). ``TIDEMARK_PURE_PYTHON=1`` in the environment forces the reference
path. ``PATH`` says in words which one is in use (``tidemark config check`` prints it).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Final

from tidemark.pgoutput.messages import UNCHANGED_TOAST, BinaryDatum

__all__ = ["FAST", "PATH", "load"]

ENV: Final = "TIDEMARK_PURE_PYTHON"


def load() -> tuple[ModuleType | None, str]:
    """The compiled module (bound to tidemark's markers) or None, and why."""
    if os.environ.get(ENV, "").strip() not in ("", "0"):
        return None, f"pure Python ({ENV} is set)"
    try:
        from tidemark import _fastpath  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, (
            f"pure Python (the compiled module is not built: {exc}; reinstall tidemark "
            "with a C compiler and the Python headers present)"
        )
    _fastpath.bind(UNCHANGED_TOAST, BinaryDatum)
    return _fastpath, "compiled (tidemark._fastpath, Cython)"


FAST, PATH = load()
