"""Tools for a laptop or a test run: an embedded Redis, a local fleet, replay of samples."""
