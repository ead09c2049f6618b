"""End-to-end tests: the real OpenCode CLI → deepmem → a scripted fake LLM, all on loopback."""
