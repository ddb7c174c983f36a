"""The study's analysis: sweeps over set-ups (grid, runner), statistics, Hessian diagnostics, reports."""
