"""The `pdd-router` command line."""
