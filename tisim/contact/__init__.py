"""Contact: analytic colliders, detection, NCP functions, Delassus operator.

A sibling of the solvers: each piece is testable alone and reused by whichever
solver needs it.
"""
