"""The real-time (PD) solver's frictional contact: contact points and frames
(``frames``), detection against analytic colliders and between objects (``detection``),
the Delassus operator (``delassus``), the NCP functions and the friction cone
(``functions``), the nonsmooth Newton update on the host (``pd_contact``) and on the
device (``device_ncp``, with its Taichi functions in ``device_functions``, the line
search that evaluates its trials at once in ``device_line_search`` and the collider gap
test in ``device_colliders``).

Each part is testable alone; the PD solver reaches them through
:class:`tisim.contact.ncp.pd_contact.PDContact`.
"""
