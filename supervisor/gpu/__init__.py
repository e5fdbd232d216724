"""GPUs: NVML probing and each GPU's reading, placement of games on devices, the memory gate
before a start, moves between GPUs (carried out here; the stability policy decides them),
device checks, and the GpuPlacer that owns which game is on which GPU.
"""
