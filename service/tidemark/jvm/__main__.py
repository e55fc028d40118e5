"""``python -m tidemark.jvm classpath JARS``: what ``make jvm`` compiles against (``JARS``:
the jar folder, ``.jars`` or ``$TIDEMARK_JARS_DIR``).

``python -m tidemark.jvm archive``: the driver's class-data archives in the jar folder
(``tidemark.jvm.archive``, ``tidemark.jvm.training``), each made unless it is there."""

import sys
from pathlib import Path

from tidemark.jvm import compile_classpath

args = sys.argv[1:]
if len(args) == 2 and args[0] == "classpath":
    print(compile_classpath(Path(args[1])))
elif args == ["archive"]:
    import time

    from tidemark.jvm.training import create_all
    from tidemark.spark import jars_dir

    started = time.monotonic()
    made = create_all(jars_dir())
    names = ", ".join(p.name for p in made)
    print(f"class-data archives: {names} ({time.monotonic() - started:.0f} s)")
else:
    sys.exit("usage: python -m tidemark.jvm classpath JARS | python -m tidemark.jvm archive")
