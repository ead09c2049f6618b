"""Everything deepmem keeps on disk: originals (CCR), project memory, checkpoints."""
