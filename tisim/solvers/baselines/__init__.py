"""Baseline integrators for comparisons with the variational ADMM integrator: backward
Euler with Newton (``implicit_euler``) and XPBD (``xpbd``). They share meshes, energies,
gravity, handles and the penalty contact potential (``common``); ``config`` is Taichi-free."""
