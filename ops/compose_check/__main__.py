"""``python -m ops.compose_check [PROFILE ...]``: see the package's docstring."""

import sys

from ops.compose_check.main import main

sys.exit(main())
