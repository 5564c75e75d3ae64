"""Surrogate models (BoTorch / GPyTorch, float64)."""
