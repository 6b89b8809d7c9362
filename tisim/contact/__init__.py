"""Contact: analytic colliders (``colliders``), the PD solver's NCP contact (``ncp/``)
and the C-IPC parts of the cloth solver (``ipc/``).

A sibling of the solvers: each piece is testable alone and reused by whichever
solver needs it.
"""
