"""The transport-independent NSPB protocol.

Pure state machines consume messages and executor completions and return effects (STYLE.md 1-2).
The simulator (``stateful.simulation``) and the
process runtime (``stateful.replica_main``, ``stateful.runtime``) run the same cores.
"""
