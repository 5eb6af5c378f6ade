"""Fleet-wide limits a worker enforces around each run: concurrency slots and breakers."""
