"""Service graphs on the cluster: placement, replica processes, records, restore after a crash.

``manager.GraphManager`` is the entry point; ``api`` is its REST layer.
"""
