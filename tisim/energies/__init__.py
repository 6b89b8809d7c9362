"""Energies with their assembly: shell membrane, hinge bending, strain limiting."""
