"""Argument checks, dtype facts, loss graphs, host arrays, gradient sums; imports no other folder."""
