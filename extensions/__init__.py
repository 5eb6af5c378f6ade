"""Extensions that ship with toolfleet."""
