"""The kernel both sides stand on: the wire contract, Redis keys, the store and its Lua, settings,
Redis clients, Celery configuration, broker transports, errors, logs and the metrics server.

``producer`` (what a pipeline imports) and ``worker`` (what scores) both import it; it imports
neither, and none of it loads torch.
"""
