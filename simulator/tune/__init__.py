"""`vjob tune`: a multi-objective search (Optuna) of the UBIS weights, the interactive cap and
the vjob policy's knobs, over the simulator, on a site's own trace (docs/tune.md)."""
