"""Code generation: Triton kernels with virtual-tensor I/O, elementwise regions, lowerings and realization.

Imports the core only."""
