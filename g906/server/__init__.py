"""The OpenAI-compatible HTTP server (Starlette + uvicorn) in front of the embedded engine.

A generation request flows one way through these modules:

    app.py                  the app: routes and exception handlers
    intake.py               auth.py, then readiness, body limit, JSON, validation, model name
    chat_completions.py     an API route (and completions.py): its request -> GenerationRequest
    generation.py           GenerationRequest; admission and the engine streams
    assembler.py            engine deltas -> output parsers (parsers/) -> choices, full or streamed
    openai_answers.py       choices -> OpenAI objects and stream chunks (sse.py frames the stream)

Beside them: state.py (what the app knows between requests), errors.py (OpenAI's error shape),
disconnect.py (a client that goes away aborts its request), metrics.py (Prometheus),
info_routes.py (/v1/models, /health, /metrics, /version, /openapi.json), protocol.py (the OpenAI
pydantic models)."""
