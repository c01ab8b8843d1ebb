"""The ground floor: the controller <-> agent wire protocol and small process utilities.

Modules here import only the standard library and pydantic, never another project package, so
the client SDK, the agent and the controller can all stand on them.
"""
