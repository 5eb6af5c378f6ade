"""What a worker process serves: extensions found and loaded, their settings, switches."""
