"""Training: one engine for both backends, on canonical parameter trees."""
