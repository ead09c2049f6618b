"""Per-tool compressors: one module each, one pure ``compress(output, budget)`` function."""
