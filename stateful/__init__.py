"""Stateful service graphs with NSPB primary-backup replication (HAMS, Zhao et al.).

Entry points: ``stateful.graph.GraphSpec`` (a service graph), ``stateful.services`` (the SP-
and OL-like examples), ``stateful.runtime.LocalGraph`` (deploy on local processes; the
``ReplicaLauncher`` protocol and the ``on_replica_failed`` failure signal are where the agent
and the controller plug in), ``stateful.simulation.SimCluster`` (the deterministic simulator),
``stateful.checker.ConsistencyChecker``. The protocol itself is in ``stateful.core``.
"""
