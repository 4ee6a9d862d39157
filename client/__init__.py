"""crowdgrad client package: the desktop client (Python), the in-game client
(``ingame``: a game calls it once per frame) and the browser client (``web/``:
JavaScript in a Web Worker, built into ``web/static``)."""

from pathlib import Path

#: The volunteer page the coordinator serves at ``/``: built by
#: ``client/web/build.mjs`` and committed, so a ``pip install`` needs no node.
WEB_ROOT = Path(__file__).parent / "web" / "static"
