"""Linear algebra behind one factorization interface: CHOLMOD through scikit-sparse
when present, scipy otherwise; sparse inverse; Krylov solvers."""
