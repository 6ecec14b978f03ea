"""Scaling studies: planning (DLBS-style parameters, variables and extensions) and running."""
