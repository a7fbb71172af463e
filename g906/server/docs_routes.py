"""/docs (Swagger UI over /openapi.json) and /ping (vLLM's and SageMaker's liveness route: the
same answer as /health).

The Swagger page is a small HTML document that loads swagger-ui's script and stylesheet by URL
(G906_SWAGGER_UI_URL, default the swagger-ui-dist package on jsDelivr) and points it at this
server's /openapi.json: the server ships no copy of swagger-ui, and a browser without access to
that URL can set the variable to a mirror."""

from __future__ import annotations

import html
import os

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from g906.server import info_routes

SWAGGER_UI_URL = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5"


def swagger_ui_url() -> str:
    return (os.environ.get("G906_SWAGGER_UI_URL") or SWAGGER_UI_URL).rstrip("/")


def swagger_page(openapi_url: str, title: str, assets: str) -> str:
    a, spec, t = (html.escape(x, quote=True) for x in (assets, openapi_url, title))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{t}</title>
<link rel="stylesheet" href="{a}/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<noscript>This page needs JavaScript; the API description itself is at <a href="{spec}">{spec}</a>.</noscript>
<script src="{a}/swagger-ui-bundle.js" crossorigin="anonymous"></script>
<script>
window.ui = SwaggerUIBundle({{url: "{spec}", dom_id: "#swagger-ui", deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout"}});
</script>
</body>
</html>
"""


async def docs(request: Request) -> Response:
    root = request.scope.get("root_path", "")
    return HTMLResponse(swagger_page(f"{root}/openapi.json", "g906 API", swagger_ui_url()))


async def ping(request: Request) -> Response:
    return await info_routes.health(request)


ROUTES = [
    Route("/docs", docs, methods=["GET"]),
    Route("/ping", ping, methods=["GET", "POST"]),
]
