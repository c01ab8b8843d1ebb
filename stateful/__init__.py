"""Stateful service graphs with NSPB primary-backup replication (HAMS)."""
