"""Cloth and shells with C-IPC contact (``solver.type = "cloth"``)."""
