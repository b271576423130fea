"""`inferq bench`: inferq measured against the model alone, the seed pattern and LitServe.

Modules: `corpus` (shipped text inputs, corpus → model), `images` (the photo corpus, built
in memory), `inputs` (request bodies and costs per corpus), `multipart` (upload bodies),
`stats` (percentiles, medians), `http` + `load` (HTTP load generators), `procs` (child
processes), `model` (loads a model the worker's way), `ceiling` (the model alone), `seed_app`
/ `seed_images_app` (the seed pattern), `litserve_app`, `systems` (how each server is
started), `runner` (the measurement plan), `report` (table and plot), `main` (the command).
"""
