"""What the server says about itself: /v1/models, /health, /metrics, /version, /openapi.json."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from g906.server import protocol as P
from g906.server.auth import check_auth
from g906.server.errors import APIError
from g906.server.state import ServerState, state_of
from g906.version import __version__


def _card(st: ServerState) -> P.ModelCard:
    return P.ModelCard(id=st.served_model_name, created=P.now(), root=st.served_model_name,
                       max_model_len=st.max_model_len)


async def list_models(request: Request) -> Response:
    st = state_of(request)
    check_auth(request, st)
    return JSONResponse(P.ModelList(data=[_card(st)]).model_dump(mode="json"))


async def get_model(request: Request) -> Response:
    st = state_of(request)
    check_auth(request, st)
    mid = request.path_params["model_id"]
    if mid != st.served_model_name:
        raise APIError(404, f"the model {mid!r} does not exist", param="model", code="model_not_found")
    return JSONResponse(_card(st).model_dump(mode="json"))


async def health(request: Request) -> Response:
    st = state_of(request)
    if st.status == "ok" and st.engine is not None and st.engine.running:
        return JSONResponse({"status": "ok"})
    status = st.status if st.status != "ok" else "failed"
    detail = st.detail or ("the model is loading" if status == "loading" else "the engine stopped")
    return JSONResponse({"status": status, "detail": detail}, status_code=503)


async def metrics(request: Request) -> Response:
    st = state_of(request)
    return Response(st.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def version(request: Request) -> Response:
    st = state_of(request)
    return JSONResponse(P.VersionInfo(version=__version__, model=st.served_model_name,
                                      engine=st.engine_info).model_dump(mode="json"))


async def openapi(request: Request) -> Response:
    from g906.server.openapi import openapi_document

    return JSONResponse(openapi_document(auth=bool(state_of(request).api_key)))
