"""Compiling for accelerators this machine does not have: target descriptions, the memory a
compiled program needs, and the resources of the GPU kernels in it."""
