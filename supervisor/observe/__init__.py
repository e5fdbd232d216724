"""What operators see: the status document (`rlsup status --json`) and its schema, read-only access
to the state database, Prometheus metrics, alert hooks and log files.
"""
