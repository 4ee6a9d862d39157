"""Test and benchmark tooling: an in-process loopback crowd, hostile frames, a fuzzer,
a fault-injecting TCP proxy and a soak of real processes behind it.

Not part of the product (not in the wheel): tests and benchmarks import it from a
checkout of the repository.
"""
