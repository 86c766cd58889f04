"""Hostile probes run from outside against real servers on loopback: each prints one line
per probe (``probe <name>: ok|FAIL <why>``) and exits non-zero on any failure."""
