"""`radixflow serve`'s server: load an engine, serve its app under uvicorn, shut down gently."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import uvicorn

from radixflow.runtime.engine import Engine
from radixflow.runtime.server.app import create_app
from radixflow.runtime.server.engine_client import ServerContext
from radixflow.runtime.server.limits import ServerLimits


def serve(
    engine_kwargs: dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 30000,
    *,
    api_key: str | None = None,
    admin_api_key: str | None = None,
    cors_origins: list[str] | None = None,
    served_model_name: str | list[str] | None = None,
    log_level: str = "info",
    graceful_timeout: float = 30.0,
    limits: ServerLimits | None = None,
) -> int:
    """Load an engine and serve it until SIGINT/SIGTERM; returns the exit code.

    On the signal the server stops accepting connections and gives in-flight requests
    `graceful_timeout` seconds; then it aborts them (streams end with finish_reason "abort"
    and `[DONE]`), and shuts the engine down: 0. When the engine fails (a tensor-parallel
    rank died) its requests end with an engine error (HTTP 500 / an error event) and the
    server exits: 1.
    """
    engine = Engine(**engine_kwargs)
    try:
        app = create_app(
            engine,
            api_key=api_key,
            admin_api_key=admin_api_key,
            cors_origins=cors_origins,
            served_model_name=served_model_name,
            owns_engine=True,
            limits=limits,
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=graceful_timeout + 10,
        )
        server = _GracefulServer(config, app.state.ctx, graceful_timeout)
        threading.Thread(
            target=_exit_on_failure, args=(engine, server), name="radixflow-failure", daemon=True
        ).start()
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down
        pass
    finally:
        engine.shutdown()
    return 1 if engine.failure is not None else 0


def _exit_on_failure(engine: Engine, server: uvicorn.Server) -> None:
    engine.failed.wait()
    server.should_exit = True


class _GracefulServer(uvicorn.Server):
    """uvicorn, plus: `graceful_timeout` after the exit signal, abort what still runs."""

    def __init__(self, config: uvicorn.Config, ctx: ServerContext, graceful_timeout: float):
        super().__init__(config)
        self.ctx = ctx
        self.graceful_timeout = graceful_timeout

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.should_exit:
            self.ctx.ready = False
            self.loop.call_soon_threadsafe(
                self.loop.call_later, self.graceful_timeout, self.ctx.client.abort, None
            )
        super().handle_exit(sig, frame)
