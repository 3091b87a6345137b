"""The HTTP face: one `Engine` behind SGLang's native routes, OpenAI's /v1 routes and /metrics.

    app.py                 create_app(engine): the FastAPI app, its lifespan and middleware
    launch.py              serve(engine_kwargs, ...): load the engine and run uvicorn
    limits.py              ServerLimits: what one HTTP request may ask for
    errors.py              APIError / OpenAIError and the handlers that answer them
    wire.py                strict JSON and server-sent event responses
    engine_client.py       EngineClient (runs batches, tracks rids), ServerContext
    request_guard.py       API keys and the body-size cap, checked before any route runs
    metrics.py, heap.py    Prometheus metrics; periodic malloc_trim
    native_protocol.py     /generate and /abort_request bodies
    native_routes.py       SGLang's native routes (/generate, /health, /get_load, ...)
    openai_protocol.py     chat and completions request bodies
    openai_convert.py      OpenAI requests -> engine inputs, engine results -> OpenAI fields
    openai_tools.py        tool calling and reasoning for the chat route
    openai_completions.py  /v1/models, /v1/completions, /v1/embeddings
    openai_chat.py         /v1/chat/completions
    responses_protocol.py  /v1/responses request bodies
    responses_output.py    Response objects, their output items and stream events
    responses_api.py       /v1/responses

The command line (`radixflow serve`, runtime/cli.py) imports this package, never the reverse.
"""
