"""Running one case: its inputs guarded, the float64 oracle, each backend's call graded and timed into a row."""
