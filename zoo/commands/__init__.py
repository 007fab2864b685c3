"""CLI subcommands, one module per feature."""
