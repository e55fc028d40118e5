"""``python -m tidemark.jvm classpath JARS``: what ``make jvm`` compiles against (``JARS``:
the jar folder, ``.jars`` or ``$TIDEMARK_JARS_DIR``)."""

import sys
from pathlib import Path

from tidemark.jvm import compile_classpath

if len(sys.argv) != 3 or sys.argv[1] != "classpath":
    sys.exit("usage: python -m tidemark.jvm classpath JARS")
print(compile_classpath(Path(sys.argv[2])))
