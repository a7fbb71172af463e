"""External engines a Plan can be handed to (engine.kind = "vllm").

Nothing here imports torch: these modules run a separate program and watch it."""
