"""The sans-IO coordinator core: a state machine fed bytes and ticks, returning actions.

Nothing here opens a socket, starts a thread, reads the clock or touches the store;
the runtime (``coordinator.runtime``) and the server (``coordinator.http``) do that
around it, and the simulator drives the same core in virtual time. The rule is a
contract in pyproject.toml (``[tool.importlinter]``), checked by ``make test``.
"""
