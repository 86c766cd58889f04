"""The Celery app: one queue per device kind, JSON only, no result backend."""

from __future__ import annotations

from celery import Celery, signals

from producer.celery_config import TASK_NAME, celery_config
from producer.settings import Settings
from worker.runtime import get_runtime, reset_runtime
from worker.sweep import SweepTimer


def create_app(settings: Settings, *, eager_runtime: bool = True, sweep: bool = True) -> Celery:
    app = Celery("rerankq", set_as_current=False)
    app.conf.update(celery_config(settings))

    @app.task(name=TASK_NAME, bind=True, ignore_result=True)
    def score_window(self, stream_id: str, window: int) -> str:  # type: ignore[no-untyped-def]
        from producer.validation import check_stream_id

        check_stream_id(stream_id)
        return get_runtime(settings).scorer.process(stream_id, int(window), delivery=str(self.request.id))

    if eager_runtime:
        @signals.worker_process_init.connect(weak=False)
        def _load_in_child(**_: object) -> None:
            reset_runtime()
            get_runtime(settings)

        @signals.worker_ready.connect(weak=False)
        def _load_in_main(sender: object = None, **_: object) -> None:
            # prefork loads in each child instead; never in the parent that forks them.
            pool = getattr(getattr(sender, "pool", None), "__class__", type(None)).__module__
            if "prefork" not in pool:
                get_runtime(settings)

    if sweep:
        timer = SweepTimer(settings)

        # The main process sweeps (worker_ready fires there only, after the pool forked).
        @signals.worker_ready.connect(weak=False)
        def _start_sweep(**_: object) -> None:
            timer.start()

        @signals.worker_shutting_down.connect(weak=False)
        def _stop_sweep(**_: object) -> None:
            timer.request_stop()  # no join: this runs inside a signal handler

    app.score_window = score_window  # type: ignore[attr-defined]
    return app
