"""Worker ranks (1..tp_size-1): build this rank's ModelRunner, then run every forward rank 0
sends until it says stop.

    spawn ─► join the group ─► load the shard ─► startup check (all ranks) ─► loop:
                                                    recv batch ─► runner.forward ─► ...
                                                    STOP ─► leave the group, exit 0

A worker exits too when rank 0 goes away: its next receive fails (gloo: the peer's socket
closes; NCCL: the group's timeout, which rank 0's idle pings keep from firing early), and a
worker on rank 0's machine also dies with its parent (Linux's parent-death signal).
"""

from __future__ import annotations

import logging
import multiprocessing.process
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.distributed.group import TPGroup, exit_rank_process, init_tp_group
from radixflow.runtime.distributed.layout import TPLayout
from radixflow.runtime.distributed.step_channel import recv_forward
from radixflow.runtime.model_loader import Checkpoint, load_checkpoint
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.server.data_parallel import die_with_parent

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartupReport:
    """What each rank says once its runner is built (or failed to build)."""

    rank: int
    error: str | None
    kv_pages: int
    bad_input: bool = False  # the error is a ValueError: the model or a knob does not fit

    @classmethod
    def failed(cls, rank: int, exc: BaseException) -> StartupReport:
        return cls(rank, f"{type(exc).__name__}: {exc}", 0, isinstance(exc, ValueError))


def load_rank_checkpoint(config: EngineConfig) -> Checkpoint:
    """The checkpoint every rank loads from (each rank keeps only its shard of it)."""
    return load_checkpoint(
        config.model_path,
        tokenizer_path=config.tokenizer_path,
        chat_template=config.chat_template,
        generation_config=config.generation_config,
    )


def check_startup(tp: TPGroup, mine: StartupReport) -> None:
    """Every rank states its outcome; all raise one error naming each rank that failed, or
    whose KV pool differs from rank 0's (a slot must mean the same place on every rank): a
    ValueError when every failure was one (bad input, as on one device), else RuntimeError."""
    gathered: list[StartupReport | None] = [None] * tp.size
    dist.all_gather_object(gathered, mine, group=tp.group)
    reports = [r for r in gathered if r is not None]
    failed = [r for r in reports if r.error]
    problems = [f"rank {r.rank}: {r.error}" for r in failed]
    pages = {r.kv_pages for r in reports if not r.error}
    if not problems and len(pages) > 1:
        problems.append(f"the ranks' KV pools differ in pages: {sorted(pages)}")
    if problems:
        error = ValueError if failed and all(r.bad_input for r in failed) else RuntimeError
        raise error("tensor-parallel startup failed: " + "; ".join(problems))


def build_rank(config: EngineConfig, tp: TPGroup) -> tuple[ModelRunner | None, StartupReport]:
    """This rank's runner and its report; a failure is reported, not raised, so that every
    rank reaches `check_startup`."""
    try:
        runner = ModelRunner(config, load_rank_checkpoint(config), tp)
    except Exception as exc:
        logger.exception("rank %d failed to start", tp.rank)
        return None, StartupReport.failed(tp.rank, exc)
    return runner, StartupReport(tp.rank, None, runner.pool.capacity_pages)


def worker_main(config: EngineConfig, layout: TPLayout, rank: int, parent_pid: int) -> None:
    """The body of worker process `rank` (spawned by rank 0's node, or by `run_node`)."""
    die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        sys.exit(1)
    logging.basicConfig(format=f"%(asctime)s %(levelname)s [tp{rank}] %(name)s: %(message)s")
    config = layout.rank_config(config, rank)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    device = torch.device(config.device)
    tp = init_tp_group(rank, layout.tp_size, layout.init_method, device, layout.timeout_s)
    runner, report = build_rank(config, tp)
    try:
        check_startup(tp, report)
    except RuntimeError as exc:  # every rank has the same error; a traceback adds nothing
        logger.error("%s", exc)
        exit_rank_process(1)
    assert runner is not None  # check_startup raised otherwise
    serve_steps(tp, runner)
    exit_rank_process(0)


def serve_steps(tp: TPGroup, runner: ModelRunner) -> None:
    """Run rank 0's forwards until it says stop."""
    while (batch := recv_forward(tp, runner.pool, runner.device)) is not None:
        runner.forward(batch)


def spawn_workers(
    config: EngineConfig, layout: TPLayout, ranks: range
) -> list[multiprocessing.process.BaseProcess]:
    """Start worker processes for `ranks` (torch.multiprocessing, start method spawn)."""
    ctx = mp.get_context("spawn")
    procs: list[multiprocessing.process.BaseProcess] = []
    for rank in ranks:
        proc = ctx.Process(
            target=worker_main,
            args=(config, layout, rank, os.getpid()),
            name=f"radixflow-tp{rank}",
            daemon=True,
        )
        proc.start()
        procs.append(proc)
    return procs


def run_node(config: EngineConfig) -> int:
    """`radixflow serve --node-rank R` (R > 0): run this node's worker ranks until rank 0
    stops them; 0 when all stopped cleanly, else 1 (naming the ranks that failed)."""
    layout = TPLayout.of(config)
    logger.info(
        "node %d of %d: tensor-parallel ranks %s, meeting at %s",
        layout.node_rank,
        layout.nnodes,
        list(layout.local_ranks),
        layout.init_method,
    )
    procs = spawn_workers(config, layout, layout.local_ranks)
    for proc in procs:
        proc.join()
    failed = [f"{p.name} (exit code {p.exitcode})" for p in procs if p.exitcode != 0]
    if failed:
        logger.error("worker ranks failed: %s", ", ".join(failed))
        return 1
    return 0
