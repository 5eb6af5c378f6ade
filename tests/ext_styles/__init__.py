"""One tool, ``greet``, written in each of the four supported styles (test-only)."""
