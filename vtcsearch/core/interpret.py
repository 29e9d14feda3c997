"""Run a TensorGraph under a Strategy with real tensors: the reference semantics of virtual tensors.

Physical tensors get storage of their own (poisoned with NaN, so an element
nobody wrote shows up); a virtual tensor has none.  Compute ops read their
inputs through the resolved IndexMaps and write their outputs through them;
movement ops perform only their residual copies.  So the result equals eager
PyTorch exactly when the strategy is sound, and goes wrong in the way a GPU
would when it is not (a hazard overwrites data still needed).  It runs the ATen
ops one by one with torch indexing: slow, device-agnostic, and the oracle that
every compiled realization is checked against.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .graph import TensorGraph
from .ops import TensorArg
from .strategy import Strategy


class StrategyInterpreter:
    """Executes ``graph`` as ``strategy`` lays it out in memory."""

    def __init__(self, graph: TensorGraph, strategy: Strategy, module_state: dict[str, torch.Tensor]):
        """``module_state`` maps graph input names (parameters, buffers) to real tensors."""
        self.graph, self.strategy = graph, strategy
        self.state = module_state
        strategy.validate()

    @classmethod
    def for_exported(cls, graph: TensorGraph, strategy: Strategy) -> "StrategyInterpreter":
        """Take parameters and buffers from the exported program the graph came from."""
        ep = graph.exported
        state: dict[str, torch.Tensor] = {}
        for spec in ep.graph_signature.input_specs:
            if spec.target is None:
                continue
            if spec.target in ep.state_dict:
                state[spec.arg.name] = ep.state_dict[spec.target]
            elif spec.target in getattr(ep, "constants", {}):
                state[spec.arg.name] = ep.constants[spec.target]
        return cls(graph, strategy, state)

    def __call__(self, *user_inputs: Any) -> list[torch.Tensor]:
        g, s = self.graph, self.strategy
        tensors = [a for a in user_inputs if isinstance(a, torch.Tensor)]
        if len(tensors) != len(g.inputs):
            raise ValueError(f"expected {len(g.inputs)} tensor inputs, got {len(tensors)}")
        device = tensors[0].device if tensors else next(iter(self.state.values())).device
        storage: dict[str, torch.Tensor] = dict(self.state)
        storage.update(dict(zip(g.inputs, tensors)))
        for t in s.physical_intermediates():
            info = g.tensors[t]
            fill = float("nan") if info.dtype.is_floating_point else -1
            storage[t] = torch.full(info.shape, fill, dtype=info.dtype, device=device)
        tables = _TableView(self, storage)

        def read(t: str) -> torch.Tensor:
            return s.resolve(t).gather(storage, tables=tables, dtype=g.tensors[t].dtype)

        def write(t: str, value: torch.Tensor) -> None:
            s.resolve(t).scatter(value, storage, tables=tables)

        for op in g.ops.values():
            if op.kind == "compute":
                vals = {t: read(t) for t in op.inputs}
                args, kwargs = _substitute(op, vals)
                out = op.target(*args, **kwargs)
                outs = list(out) if isinstance(out, (tuple, list)) else [out]
                tensors_out = [o for o in outs if isinstance(o, torch.Tensor)]
                for name, value in zip(op.outputs, tensors_out):
                    write(name, value)
            else:
                for r in s.residuals_of(op.name):
                    for dst, src in r.pairs:
                        _copy_piece(dst, src, storage, tables, r.domain, g.tensors[r.dst_tensor].dtype)
        return [read(t) for t in g.outputs]


class _TableView(dict):
    """Index tensors for indirect maps, read on demand through the strategy."""

    def __init__(self, interp: StrategyInterpreter, storage: dict[str, torch.Tensor]):
        super().__init__()
        self.interp, self.storage = interp, storage

    def __contains__(self, name: object) -> bool:
        return name in self.interp.graph.tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        s = self.interp.strategy
        return s.resolve(name).gather(self.storage, dtype=self.interp.graph.tensors[name].dtype)


def _substitute(op, vals: dict[str, torch.Tensor]) -> tuple[Sequence, dict]:
    """The fx node's args with tensor inputs replaced by values."""
    node = op.node

    def sub(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return vals.get(a.name, vals.get(_tensor_name(op, a)))
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x) for x in a)
        return a

    return tuple(sub(a) for a in node.args), {k: sub(v) for k, v in node.kwargs.items()}


def _tensor_name(op, node: torch.fx.Node) -> str:
    return node.name


def _copy_piece(dst, src, storage, tables, domain, dtype) -> None:
    """One residual copy: read ``src`` over the pair's box and write it through ``dst``."""
    from .mapping import IndexMap
    shapes = {}
    m_src = IndexMap(domain, [src], shapes)
    m_dst = IndexMap(domain, [dst], shapes)
    # gather without the coverage check: the pair covers only its box
    value = m_src.gather(storage, tables=tables, dtype=dtype, check=False)
    m_dst.scatter(value, storage, tables=tables)


def run_eager(graph: TensorGraph, *user_inputs: Any) -> list[torch.Tensor]:
    """The exported program itself (no virtual tensors), for comparison: user outputs only."""
    ep = graph.exported
    outs = ep.module()(*user_inputs)
    return list(outs) if isinstance(outs, (tuple, list)) else [outs]
