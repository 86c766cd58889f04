"""Hostile probes of a private deployment, from outside: each starts what it probes, on loopback only."""
