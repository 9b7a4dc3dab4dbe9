"""The pipelines a decision is executed along, one small unit each (``direct``: colocated,
P-MD, P-RLD; ``handoff``: P-RLD-MD one-shot and catch-up), over ``Upstream``."""
