"""The fault-injection soak: its engine, faults, monitor and analysis (tests/chaos runs it)."""
