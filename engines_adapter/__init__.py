"""The boundary between pdd-router and inference engines."""
