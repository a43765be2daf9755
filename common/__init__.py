"""Base modules every other package may import: input errors that name the field, YAML and override
loading, and the checks shared by configs, flows and the CLI. Imports nothing from this project."""
