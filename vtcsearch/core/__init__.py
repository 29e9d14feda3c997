"""The core: expressions, mapping functions, the movement registry, graphs, capture, fusion, the VTOG and strategies.

Nothing here imports code generation, cost models, solvers or the application."""
