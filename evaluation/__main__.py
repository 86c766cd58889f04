"""``python -m evaluation``: see ``evaluation.command``."""

from evaluation.command import main

raise SystemExit(main())
