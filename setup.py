"""Builds the optional compiled per-change path (``tidemark._fastpath``, Cython).

Everything else is declared in ``pyproject.toml``. Without Cython or a C compiler the
package still installs: the build of the extension is skipped with a warning and
tidemark runs its pure-Python path (``tidemark config check`` says which one is used).
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Skip the extension, loudly, when it cannot be compiled here."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all
            _skipped(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # the compiler failed on this extension
            _skipped(exc)


def _skipped(exc: Exception) -> None:
    print(
        f"WARNING: tidemark's compiled per-change path was not built ({exc}); "
        "tidemark will run its pure-Python path",
        file=sys.stderr,
    )


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        _skipped(ImportError("Cython is not installed"))
        return []
    return cythonize(
        [Extension("tidemark._fastpath", ["service/tidemark/_fastpath.pyx"])],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
