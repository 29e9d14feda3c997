"""Pictures of a VTOG and of a points-to graph (matplotlib, headless)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402

from .atomic import atomic_path  # noqa: E402

if TYPE_CHECKING:
    from .core.vtog import VTOG

CLASS_COLOURS = {"I": "tab:green", "partial": "tab:blue", "II": "tab:orange"}


def draw_vtog(v: "VTOG", path: str, chosen: Iterable[int] | None = None, title: str | None = None) -> None:
    """Tensors left to right in program order; edges coloured by class, chosen ones bold (the points-to graph)."""
    chosen = set(chosen) if chosen is not None else None
    g = v.nx
    order = {t: k for k, t in enumerate(v.graph.tensors)}
    gen = nx.DiGraph()
    gen.add_nodes_from(g.nodes)
    gen.add_edges_from((u, w) for u, w, _ in g.edges(keys=True))
    try:
        layers = {n: k for k, layer in enumerate(nx.topological_generations(
            nx.DiGraph([(e.dst, e.src) for e in v.edges if e.kind == "output_over_input"]))) for n in layer}
    except nx.NetworkXUnfeasible:
        layers = {}
    pos = {}
    for n in g.nodes:
        pos[n] = (order.get(n, 0), -(layers.get(n, 0) % 6))
    n = max(len(g.nodes), 1)
    fig, ax = plt.subplots(figsize=(min(4 + n * 0.35, 60), 6))
    virtual = {v.edges[k].src for k in chosen} if chosen else set()
    phys_only = [x for x in g.nodes if v.graph.tensors[x].physical_only]
    colours = ["black" if x in phys_only else ("white" if x in virtual else "lightgrey") for x in g.nodes]
    nx.draw_networkx_nodes(g, pos, ax=ax, node_size=120, node_color=colours, edgecolors="black")
    nx.draw_networkx_labels(g, pos, ax=ax, font_size=6, labels={x: x for x in g.nodes},
                            verticalalignment="bottom")
    for e in v.edges:
        bold = chosen is not None and e.id in chosen
        if chosen is not None and not bold:
            style, width, alpha = "dotted", 0.5, 0.3
        else:
            style, width, alpha = "solid", 2.0 if bold else 0.8, 1.0
        nx.draw_networkx_edges(g, pos, ax=ax, edgelist=[(e.src, e.dst)], edge_color=CLASS_COLOURS[e.cls],
                               style=style, width=width, alpha=alpha, arrows=True, arrowsize=8,
                               connectionstyle="arc3,rad=0.15")
    handles = [plt.Line2D([], [], color=c, label=f"Type {k}" if k != "partial" else "partially contiguous")
               for k, c in CLASS_COLOURS.items()]
    ax.legend(handles=handles, loc="upper right", fontsize=7)
    ax.set_title(title or ("points-to graph" if chosen is not None else "VTOG"))
    ax.axis("off")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
