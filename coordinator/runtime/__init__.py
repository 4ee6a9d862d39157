"""The runtime around the core: the thread that owns it, acks, the journal, checkpoints.

Threads and files live here; the core's state is touched only from the core thread.
"""
