"""Pure decision logic for pdd-router: types and policies, no I/O, no clock, no framework."""
