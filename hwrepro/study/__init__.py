"""The study's analysis: sweeps over set-ups (grid, runner), statistics, Hessian diagnostics, reports."""

# Modules, imported by name (e.g. `from hwrepro.study import report`): hessian imports JAX, the others do not.
__all__ = ["grid", "hessian", "report", "stats", "sweep"]
