"""C-IPC contact parts, each testable alone (checked against IPC Toolkit's ``ipctk``):
distances and their derivatives, barrier, smoothed friction, additive CCD, broad phase.

Kernels work on Taichi fields that stay resident between calls; the host reads scalars
and the local Hessians it assembles.
"""
