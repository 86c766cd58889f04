"""Hostile probes of a private deployment, from outside: each starts what it probes, on loopback
only, prints one line per probe (``probe <name>: ok|FAIL <why>``) and exits non-zero on any failure."""
