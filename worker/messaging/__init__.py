"""The Dramatiq side: the broker and its consumers, middleware, actors, maintenance."""
