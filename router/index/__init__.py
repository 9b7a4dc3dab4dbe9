"""The prefix index: which instance holds which leading blocks of a request's chain."""
