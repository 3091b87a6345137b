"""The model's ops, one per file, each bound to its implementation once, when the model is built.

An op's `choose_*` function reads the `OpsTarget` (device, dtype, whether the Triton kernels
run) and returns the implementation with its name: Triton (imported only when chosen), the
C++ CPU kernels where kernels/cpu_build.py built them for this CPU, or torch. Layers call what
was bound; nothing is decided per call but what the arguments' shapes decide. Every
implementation is tested against its op's reference in kernels/reference.py.
"""
