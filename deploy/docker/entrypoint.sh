#!/bin/sh
# Empty the prometheus-client multiprocess directory, then become the command (exec):
# the command is tini's one child (tini is PID 1, reaping orphans) and gets the
# container's SIGTERM from it, once.
# A container restarted inside the same pod keeps its emptyDir; stale files of the dead
# processes would otherwise be summed into the new ones' metrics.
set -eu
if [ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ]; then
    mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
    find "$PROMETHEUS_MULTIPROC_DIR" -mindepth 1 -delete
fi
exec "$@"
