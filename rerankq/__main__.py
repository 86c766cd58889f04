"""``python -m rerankq``: the ``rerankq`` script without installing it."""

import sys

from rerankq import main

sys.exit(main())
