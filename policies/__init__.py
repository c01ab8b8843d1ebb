"""Pure decision code shared by the controller and the simulator.

Entry points (import them from their modules; importing ``policies`` itself stays cheap):

* ``policies.model`` — the data model and ``ClusterSnapshot``, the input of every policy;
* ``policies.primary.place_primaries`` — memory worst-fit primary placement;
* ``policies.warm_ilp.plan_warm_backups`` — the warm-backup ILP (FailLite eq. 1-7, §3.4);
* ``policies.progressive.plan_progressive`` — progressive failover (FailLite Algorithm 1);
* ``policies.failover.UnderstudyPolicy`` and ``policies.baselines`` — whole policies behind
  the ``policies.policy.FailoverPolicy`` interface;
* ``policies.actions`` — the typed plans and actions policies return.
"""
