"""Test and benchmark tooling: an in-process loopback crowd, hostile frames, a fuzzer.

Not part of the product (not in the wheel): tests and benchmarks import it from a
checkout of the repository.
"""
