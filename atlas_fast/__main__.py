"""``python -m atlas_fast``: the same as the ``atlas-fast`` command."""

import sys

from .cli import main

sys.exit(main())
