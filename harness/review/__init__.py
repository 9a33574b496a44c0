"""Reviewing run folders: comparing two runs, confirming a difference by paired reruns, the statistics and the history."""
