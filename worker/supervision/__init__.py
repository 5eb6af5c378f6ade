"""Worker processes and their health: supervisor, heartbeats, watchdog, metrics, logs."""
