"""How much to run: the stability policy that scales environments, batch size and concurrent games
down when the host is unstable and back up when calm, the presets (modes), the scaling
arithmetic, which game moves to a calmer GPU, and the host vitals it reads.
"""
