"""``python -m tidemark`` is the ``tidemark`` command."""

import sys

from tidemark.cli import main

sys.exit(main())
