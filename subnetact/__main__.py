"""``python -m subnetact demo`` / ``python -m subnetact profile ...``: see :mod:`subnetact.cli`."""

import sys

from .cli import main

sys.exit(main())
