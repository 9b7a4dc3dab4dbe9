"""The discrete-event simulator of a two-datacenter PDD cluster (import its modules)."""
