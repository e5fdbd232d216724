"""A game's life: the worker state machine and its transitions, the restart budget and backoff,
exit verdicts, heartbeat liveness, the runtime record of each worker, and start-up recovery
after a reboot.
"""
