"""The server's actors, one per file, talking only over memory channels; the supervisor wires them."""
