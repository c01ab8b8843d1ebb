"""Discrete-event simulator (SimPy) of large edge clusters, driving the same ``policies/``.

* ``sim.cluster`` — paper-sized clusters: A2 servers, family mixes and §5.5 classes, K, headroom;
* ``sim.decisions`` — the policy calls the simulator shares with the controller;
* ``sim.engine`` / ``sim.timing`` — the failover timeline of one failure and its delays;
* ``sim.metrics`` — §5.1's recovery rate, MTTR and accuracy reduction;
* ``sim.runner`` — one policy over many failure scenarios;
* ``sim.experiments``, ``sim.scale``, ``sim.paper`` — Figs. 7-11 and 13 and the paper's numbers;
* ``sim.results``, ``sim.report``, ``sim.plots``, ``sim.suite`` — aggregation and outputs.

``sim.generator`` is the small-cluster generator of the demo and the ILP bench.
"""
