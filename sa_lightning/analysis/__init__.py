"""Checks of the paper's theory: coverage depth, connection probability, bias and variance."""
