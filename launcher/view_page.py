"""The page of ``pqrl view``: one HTML document with its CSS and JavaScript inline (no outside
assets; the script draws the plots as SVG). The script and style live beside this module
(``view_page.js``, ``view_page.css``). Data comes from the server's ``/api/*`` JSON and is put in the
page as text (``textContent``), never as markup; the CSP lets only this script and style run."""

from __future__ import annotations

import base64
import hashlib
from importlib.resources import files

__all__ = ["CSP", "PAGE"]

_CSS = files("launcher").joinpath("view_page.css").read_text()
_JS = files("launcher").joinpath("view_page.js").read_text()

PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pqrl view</title><style>{_CSS}</style></head>
<body><header><a href="#/">run</a><span>pqrl view: the rollout log</span></header><main></main>
<script>{_JS}</script></body></html>
""".encode()


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# only this page's own script and style run: no outside source, no injected inline code
CSP = (
    f"default-src 'none'; script-src {_hash(_JS)}; style-src {_hash(_CSS)}; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
