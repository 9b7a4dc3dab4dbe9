"""The live control plane: a FastAPI app in front of real (or simulated) engines."""
