"""Private servers and processes for the demo, the tests and the benchmarks: redis-server, a worker
(the servers of the larger deployment shapes are in the development-only ``devservers``)."""
