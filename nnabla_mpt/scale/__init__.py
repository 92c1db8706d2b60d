"""Choosing the loss scale: policies, precision schedule, measured scaling; may import core, diagnosis."""
