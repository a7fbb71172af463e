"""Benchmarks of the engine and of any OpenAI-compatible server (`g906 bench`).

    synthetic.py   LoadedModels of random weights of the real Qwen3.5 shapes (g906.engine.synthetic),
                   built on the device, and the weight bytes a decode step reads
    bandwidth.py   copy bandwidth of the device (the batch-1 decode limit)
    metrics.py     workloads (lengths, rate, concurrency) and the figures of a run
    offline.py     the engine in-process, step by step
    online.py      streamed /v1/completions against a running server
    report.py      rich and Markdown tables
    run_record.py  what a benchmark script records about its run (versions, GPU, commit)

No torch at import time (the CLI imports this package lazily anyway)."""
