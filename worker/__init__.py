"""The worker side: Dramatiq actors, extension loading, the toolkit that validates and runs calls."""
