"""Starting and signalling processes: the launcher seam (a Protocol; the local launcher, the warm
spare, the Ray backend behind it), process identity (pid + start ticks), and out-of-memory
verdicts. Nothing above this wing knows which backend runs a worker.
"""
