"""Run docker-compose.yml for real: build its images, bring up each profile, push real jobs
through it under faults, and print one line per profile and a totals line (exit 1 on any failure).

In each profile:
- a ``rerankq submit`` of a JSONL file of jobs and a Cohere v2 call to the gateway, every job
  and every row checked in the output;
- the workers' ``/readyz`` (over HTTP, on each container's address), Prometheus's targets (all
  up, exporter and workers among them) and its alert rules loaded;
- ``docker kill`` of a worker container while a run is in flight: the restart policy brings it
  back and the run loses nothing; a restart of the broker's container (Redis, or RabbitMQ);
- every built image runs as the unprivileged user; the model cache is the volume, and what the
  worker's user writes there survives the worker's restart;
- ``stop`` while a run is in flight ends inside the grace periods, and after ``start`` the same
  (resumable) run finishes with every window; ``down`` ends inside the grace periods.

Images the registry cannot give are replaced by stand-ins of the same name built from Debian
packages (ops/standins/Dockerfile) on a base made with debootstrap, and the output says so. The
pip settings of this host (its wheel directories, its CA bundle) are handed to the build
without being written into any image. Model weights: a tiny cross-encoder built here
(devservers/tiny_model.py) and mounted into the workers, so nothing is downloaded.
"""
