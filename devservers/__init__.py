"""Servers of the deployment shapes past one Redis, started privately on free ports by the
tests and by ``ops/`` (chaos runs, benchmarks): a Redis Cluster, a Sentinel set, a RabbitMQ
node. Development only: the wheel ships ``producer`` and ``worker``, not this package. The
single redis-server the demo starts stays in ``worker.embedded``."""
