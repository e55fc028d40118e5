"""``python -m tidemark.jvm classpath``: what ``make jvm`` compiles against."""

import sys

from tidemark.jvm import compile_classpath
from tidemark.spark import jars_dir

if sys.argv[1:] != ["classpath"]:
    sys.exit("usage: python -m tidemark.jvm classpath")
print(compile_classpath(jars_dir()))
