"""Pure, synchronous, deterministic transforms of one request's conversation."""
