"""Rank 0's side of tensor parallelism: start this node's worker ranks, join their group, and
watch them.

    TPDriver.start(config)   spawn ranks 1..P-1 here, join the group (failing fast when a
                             local worker dies first); the other nodes' ranks join from
                             `radixflow serve --node-rank k`
    confirm(report)          every rank's startup outcome: one error from the constructor
    watch(on_death)          a thread that calls on_death(message) when a local worker dies
    ping()                   when idle, tell the workers rank 0 is alive (before their
                             receive would time out)
    stop()                   STOP to the workers (unless the group is broken), join them

    forward(runner, batch)   send the batch to the workers, run rank 0's part: the engine's
                             one call of the model (speculative verification included: it
                             is an extend in the same step)
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import multiprocessing.process
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.distributed.group import TPGroup, init_tp_group
from radixflow.runtime.distributed.layout import TPLayout
from radixflow.runtime.distributed.step_channel import Op, send_forward, send_op
from radixflow.runtime.distributed.worker import StartupReport, check_startup, spawn_workers
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_JOIN_POLL_S = 0.1
_STOP_JOIN_S = 10.0


class TPFailure(RuntimeError):
    """The tensor-parallel group broke (a rank died, a collective failed or timed out): the
    engine cannot run another step."""


@dataclass
class TPDriver:
    layout: TPLayout
    config: EngineConfig  # rank 0's: its device and threads
    tp: TPGroup
    procs: list[multiprocessing.process.BaseProcess]
    broken: bool = False  # a collective failed: the group can carry nothing more
    _last_ping: float = field(default_factory=time.monotonic)
    _stopping: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, config: EngineConfig) -> TPDriver:
        """Spawn this node's workers and join the group as rank 0."""
        layout = TPLayout.of(config)
        rank_config = layout.rank_config(config, 0)
        procs = spawn_workers(config, layout, layout.local_ranks[1:])
        logger.info(
            "tensor parallelism: %d ranks on %d node(s), meeting at %s; local workers %s",
            layout.tp_size,
            layout.nnodes,
            layout.init_method,
            [p.pid for p in procs],
        )
        try:
            tp = _join(layout, torch.device(rank_config.device), procs)
        except BaseException:
            _end(procs)
            raise
        return cls(layout, rank_config, tp, procs)

    @property
    def ping_interval_s(self) -> float:
        return min(10.0, self.layout.timeout_s / 4)

    def confirm(self, report: StartupReport) -> None:
        """Exchange startup outcomes with every rank; on any failure stop and raise it."""
        try:
            check_startup(self.tp, report)
        except BaseException:
            self.broken = True  # the workers leave on their own (the same error)
            self.stop()
            raise

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Call `on_death(message)` from a thread when a local worker exits unasked."""
        sentinels = {p.sentinel: p for p in self.procs}

        def run() -> None:
            while sentinels and not self._stopping.is_set():
                for ready in multiprocessing.connection.wait(list(sentinels), timeout=0.5):
                    proc = sentinels.pop(ready)  # type: ignore[arg-type]
                    proc.join()
                    if not self._stopping.is_set():
                        on_death(f"tensor-parallel worker {proc.name} (pid {proc.pid}) exited "
                                 f"with code {proc.exitcode}")  # fmt: skip

        threading.Thread(target=run, name="radixflow-tp-watch", daemon=True).start()

    def forward(self, runner: ModelRunner, batch: ForwardBatch) -> torch.Tensor:
        """Send `batch` to the workers and run rank 0's part of it: the only way rank 0 runs
        the model. Any failure breaks the group (the ranks are out of step): TPFailure."""
        try:
            send_forward(self.tp, batch)
            return runner.forward(batch)
        except Exception as exc:
            self.broken = True
            raise TPFailure(f"tensor-parallel forward failed: {exc}") from exc

    def ping(self) -> None:
        """Called by the engine loop between steps: a PING once per interval, so an idle
        worker's receive never reaches the group's timeout."""
        if self.broken or time.monotonic() - self._last_ping < self.ping_interval_s:
            return
        try:
            send_op(self.tp, Op.PING, torch.device(self.config.device))
        except Exception as exc:
            self.broken = True
            raise TPFailure(f"tensor-parallel workers unreachable: {exc}") from exc
        self._last_ping = time.monotonic()

    def stop(self) -> None:
        """STOP to the workers, then wait for this node's to exit (killing stragglers)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if not self.broken:
            try:
                send_op(self.tp, Op.STOP, torch.device(self.config.device))
            except Exception:
                logger.warning("could not tell the tensor-parallel workers to stop", exc_info=True)
        _end(self.procs)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # a broken group may fail to tear down; the process goes on
                logger.warning("tensor-parallel group teardown failed", exc_info=True)


def _join(
    layout: TPLayout, device: torch.device, procs: list[multiprocessing.process.BaseProcess]
) -> TPGroup:
    """init_tp_group as rank 0, failing at once (not at the timeout) when a local worker
    exits before every rank has joined."""
    result: list[TPGroup | BaseException] = []

    def join() -> None:
        try:
            result.append(init_tp_group(0, layout.tp_size, layout.init_method, device,
                                        layout.timeout_s))  # fmt: skip
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=join, name="radixflow-tp-join", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(_JOIN_POLL_S)
        dead = [p for p in procs if p.exitcode is not None]
        if dead and thread.is_alive():
            raise RuntimeError(
                "tensor-parallel startup failed: "
                + ", ".join(f"{p.name} exited with code {p.exitcode}" for p in dead)
                + " before the ranks met (its error is in the log above)"
            )
    if isinstance(result[0], BaseException):
        raise RuntimeError(f"tensor-parallel ranks did not meet: {result[0]}") from result[0]
    return result[0]


def _end(procs: list[multiprocessing.process.BaseProcess]) -> None:
    deadline = time.monotonic() + _STOP_JOIN_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            logger.warning("tensor-parallel worker %s did not stop; killing it", proc.name)
            proc.kill()
            proc.join()
