"""``pqrl search serve``: a corpus's bm25s index over Search-R1's retrieval API, so anything that
speaks it (a search environment's ``retriever_url``, Search-R1's own trainer) can search it.

    GET  /healthz     {"status": "ok", "corpus": "sha256:...", "documents": N, "requests": R, "queries": Q}
    POST /retrieve    {"queries": [str], "topk": int, "return_scores": bool}
                   -> {"result": [[{"document": {"id", "title", "text", "contents"}, "score": s}, ...]]}
                      (without return_scores, each entry is the document itself)

``requests`` and ``queries`` count what ``/retrieve`` answered since the server started.
``contents`` is Search-R1's ``'"Title"\\ntext'``. Only documents scoring above 0 are returned, so a
query may get fewer than ``topk``. No token: it binds to loopback unless told otherwise.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
from typing import Annotated, Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from env_server.app import _BodyLimit  # the env server's bounded body read
from pqrl.errors import PqrlError, UsageError
from tasks.corpus import Hit, LocalIndex, build_index

__all__ = ["create_app", "index_command", "serve"]

MAX_QUERIES = 256
MAX_TOPK = 100
_MAX_QUERY_CHARS = 4096
_MAX_BODY = 8 << 20  # the most queries, each of the most characters, escaped


class RetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    queries: list[Annotated[str, StringConstraints(max_length=_MAX_QUERY_CHARS)]] = Field(
        min_length=1, max_length=MAX_QUERIES
    )
    topk: int | None = Field(default=None, ge=1, le=MAX_TOPK)
    return_scores: bool = False


def _document(h: Hit) -> dict[str, str]:
    return {"id": h.id, "title": h.title, "text": h.text, "contents": f'"{h.title}"\n{h.text}'}


def create_app(index: LocalIndex, *, topk: int = 3) -> FastAPI:
    """The retrieval API over ``index``; ``topk``: what a request without one gets."""
    app = FastAPI(title="pqrl retrieval", docs_url=None, redoc_url=None)
    app.add_middleware(_BodyLimit, limit=_MAX_BODY)
    served = collections.Counter[str]()
    lock = threading.Lock()  # requests are answered in a thread pool

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        with lock:
            counts = {"requests": served["requests"], "queries": served["queries"]}
        return {"status": "ok", "corpus": index.name, "documents": index.count, **counts}

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> dict[str, Any]:  # sync: FastAPI runs it in a thread
        found = index.search(request.queries, request.topk or topk)
        with lock:
            served.update(requests=1, queries=len(request.queries))
        if request.return_scores:
            return {
                "result": [[{"document": _document(h), "score": h.score} for h in hits] for hits in found]
            }
        return {"result": [[_document(h) for h in hits] for hits in found]}

    return app


def serve(args: argparse.Namespace) -> int:
    """Indexes ``--corpus`` unless cached, then serves it until stopped."""
    from env_server.app import ServerSettings
    from env_server.http_guard import uvicorn_options
    from pqrl.serving import listening_socket
    from pqrl.serving import serve as serve_on

    try:
        if not 1 <= args.topk <= MAX_TOPK:
            raise UsageError(f"--topk must be 1 to {MAX_TOPK}, got {args.topk}")
        sock = listening_socket(args.host, args.port)  # a taken port: one line, before indexing
    except PqrlError as e:
        print(f"pqrl search serve: {e.line()}", file=sys.stderr)
        return e.exit_code
    with sock:
        try:
            index = LocalIndex.open(build_index(args.corpus))
        except PqrlError as e:
            print(f"pqrl search serve: {e.line()}", file=sys.stderr)
            return e.exit_code
        print(
            f"serving {index.name} ({index.count} documents) on http://{args.host}:{args.port}",
            file=sys.stderr,
        )
        options = uvicorn_options(ServerSettings(insecure_local=True))
        serve_on(create_app(index, topk=args.topk), sock, log_level=args.log_level, **options)
    return 0


def index_command(args: argparse.Namespace) -> int:
    """``pqrl search index FILE``: validates and indexes a corpus, prints its ``sha256:`` name."""
    try:
        index = LocalIndex.open(build_index(args.corpus))
    except PqrlError as e:
        print(f"pqrl search index: {e.line()}", file=sys.stderr)
        return e.exit_code
    print(index.name)
    return 0
