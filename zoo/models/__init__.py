"""Reference models: one file per model per backend, sharing a canonical parameter tree."""
