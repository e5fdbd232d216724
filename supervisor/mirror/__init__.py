"""The off-host checkpoint mirror on the supervisor's side: the uploader process (`python -m
supervisor.mirror.uploader`) and the state file it shares with `rlsup status`.
"""
