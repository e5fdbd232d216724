"""GPUs: NVML probing, placement of games on devices, the memory gate before a start, moves between
GPUs, device checks, and the GpuPlacer that owns which game is on which GPU.
"""
