"""The parts of ``ops/chaos.py``: the processes it kills, the faults it injects into the
queues, the readers and their ledger, the canary that checks Redis keeps what it
acknowledged, the audit at the end, and the purpose-made breakages (``--break``) that
prove the audit can fail. Nothing here is imported by ``producer`` or ``worker``.
"""
