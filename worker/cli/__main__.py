"""``python -m worker.cli``: the ``rerankq`` script without installing it."""

import sys

from worker.cli import main

sys.exit(main())
