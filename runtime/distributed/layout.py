"""Where the tensor-parallel ranks run: `nnodes` machines with tp_size / nnodes ranks each.

    node 0: rank 0 (the engine: scheduler, caches, grammars, sampler) + worker ranks 1..P-1
    node k: worker ranks k*P .. (k+1)*P - 1                  (P = tp_size / nnodes)

On GPUs a rank takes the GPU of its index on its node (cuda:local_rank); on the CPU the ranks
of a node split its cores (`num_threads` each, unless set) and its memory
(`mem_fraction_static` each).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.model_runner import resolve_device
from radixflow.runtime.server.data_parallel import available_cores, free_ports


@dataclass(frozen=True)
class TPLayout:
    tp_size: int
    nnodes: int
    node_rank: int
    init_method: str  # tcp://host:port where the ranks meet (rank 0 listens there)
    timeout_s: float

    @classmethod
    def of(cls, config: EngineConfig) -> TPLayout:
        """The layout `config` asks for; without dist_init_addr the ranks meet on a free
        loopback port (one node: config's check makes nnodes > 1 give the address)."""
        addr = config.dist_init_addr or f"127.0.0.1:{free_ports('127.0.0.1', 1)[0]}"
        return cls(
            config.tp_size, config.nnodes, config.node_rank, f"tcp://{addr}", config.dist_timeout
        )

    @property
    def ranks_per_node(self) -> int:
        return self.tp_size // self.nnodes

    @property
    def local_ranks(self) -> range:
        """The ranks this node runs (rank 0 among them on node 0)."""
        first = self.node_rank * self.ranks_per_node
        return range(first, first + self.ranks_per_node)

    def rank_config(self, config: EngineConfig, rank: int) -> EngineConfig:
        """`config` as rank `rank` runs it: its own GPU, or its share of the node's cores."""
        device = resolve_device(config.device)
        if device.type == "cuda":
            if device.index is not None:
                raise ValueError(
                    f"device {config.device} pins every tensor-parallel rank to one GPU; give "
                    "device cuda and rank r takes cuda:r on its node"
                )
            visible = torch.cuda.device_count()
            if visible < self.ranks_per_node:
                raise ValueError(
                    f"tp_size {self.tp_size} over {self.nnodes} node(s) needs "
                    f"{self.ranks_per_node} GPUs per node and {visible} are visible"
                )
            local = rank - self.local_ranks.start
            return dataclasses.replace(config, device=f"cuda:{local}")
        threads = config.num_threads or max(1, available_cores() // self.ranks_per_node)
        # the node's ranks share its RAM: each plans its weights and KV pool in its share
        fraction = config.mem_fraction_static / self.ranks_per_node
        return dataclasses.replace(
            config, device=str(device), num_threads=threads, mem_fraction_static=fraction
        )
