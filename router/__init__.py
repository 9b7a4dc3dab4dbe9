"""The pdd-router control plane: hashing, prefix index, scheduling, service, CLI."""

__version__ = "0.1.0"
