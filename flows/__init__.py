"""Prefect flows: thin compositions of tasks."""
