"""The ``understudy`` command line: ``understudy.cli.main`` and one module per command."""
