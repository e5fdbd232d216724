"""rlsup's supervisor: the daemon and the CLI (never imports torch, numpy or envpool).

PyPI's supervisord also installs a top-level package named `supervisor`; `RLSUP_SUPERVISOR`
tells ours apart (`supervisor.cli` refuses to run without it).
"""

RLSUP_SUPERVISOR = True
__version__ = "0.1.0"
