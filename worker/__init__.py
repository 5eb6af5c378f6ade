"""The worker side: Dramatiq actors, extension loading, and the toolkit that runs calls."""
