"""rlhfops command-line interface."""
