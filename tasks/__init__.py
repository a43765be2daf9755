"""Prefect tasks: thin wrappers with retries, caching and logging around the domain modules."""
