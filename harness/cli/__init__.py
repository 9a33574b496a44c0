"""The `harness` command: one module a verb (``harness.cli.<verb>``), the options they share, the terminal."""
