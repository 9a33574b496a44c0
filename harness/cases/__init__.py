"""cases."""
