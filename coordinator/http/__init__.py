"""The coordinator's face: websockets, HTTP routes, admission, dashboard and metrics.

Everything asyncio, uvicorn and FastAPI lives here; it hands frames to the runtime
and never touches the core's state itself.
"""
