"""What operators see: the status document (`rlsup status --json`) and its schema, read-only access
to the state database, Prometheus metrics, alert hooks, log files, the results table and the
dashboard's read-only web page (`dashboard.py`).
"""
