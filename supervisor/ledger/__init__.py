"""What happened, durably: the SQLite state database (events, boots, runs, modes) with its read
side (every query the supervisor and the reports run), the uptime/reboot journal, and the
Recorder, the one funnel through which the daemon records and logs an event.
"""
