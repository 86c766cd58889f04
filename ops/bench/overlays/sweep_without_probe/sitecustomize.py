"""Benchmark overlay, never used in production: a sweep that does not look at the queues
(every overdue window re-sent), the baseline of ``ops/bench/resend.py``'s side-by-side figures.

Put this folder first on a worker's PYTHONPATH; Python imports ``sitecustomize`` at start.
"""

import worker.sweep

worker.sweep.broker_probe = lambda settings: None
