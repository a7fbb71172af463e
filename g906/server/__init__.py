"""The OpenAI-compatible HTTP server (Starlette + uvicorn) in front of the embedded engine."""
