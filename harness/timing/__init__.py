"""Timing: the one timer, the machine's measured ceilings, the metrics derived from a row's time, and the run's phases."""
