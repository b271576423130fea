"""`inferq bench`: inferq measured against the model alone, the seed pattern and LitServe.

Modules: `corpus` (shipped inputs), `stats` (percentiles, medians), `load` (HTTP load
generators), `procs` (child processes), `ceiling` (the model alone), `systems` (how each
server is started), `runner` (the measurement plan), `report` (table and plot).
"""
