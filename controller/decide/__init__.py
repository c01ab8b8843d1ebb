"""The controller's decisions as pure functions: records in, a ``Decision`` out.

Decision functions do no I/O and read no clock: they get the records (read fresh by the caller
for this decision, and changed in place: the changed ones are the decision's ``apps``), the
policy's plan where one is needed, the triggering event and the time as a value.
"""
