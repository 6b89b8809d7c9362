"""Real-time local-global (projective dynamics) solver with a sparse-inverse global step."""
