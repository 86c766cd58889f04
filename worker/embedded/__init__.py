"""Private servers and processes for the demo, the tests and the benchmarks: redis-server, a worker."""
