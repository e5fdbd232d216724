"""What tests and benchmarks share to drive rlsup for real: the servers they start (SeaweedFS
for S3, a cloud metadata service, a loopback Ray cluster), a state dir built to order, a real
`rlsup run` and its helpers, and the fault-injection soak. Not part of the product: never
installed, never imported by supervisor/, training/, checkpoints/ or rlsup/. Benchmarks import it;
tests import it; it imports neither.
"""
