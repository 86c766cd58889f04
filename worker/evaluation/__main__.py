"""``python -m worker.evaluation``: see ``worker.evaluation.command``."""

from worker.evaluation.command import main

raise SystemExit(main())
