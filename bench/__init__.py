"""`inferq bench`: inferq measured against the model alone, the seed pattern, LitServe and
Infinity, and its echo path against bare FastAPI and FastAPI + one Redis round trip.

Modules: `corpus` (shipped text inputs, corpus → model), `images` (the photo corpus, built
in memory), `inputs` (request bodies and costs per corpus), `multipart` (upload bodies),
`stats` (percentiles, medians), `http` + `load` (HTTP load generators), `procs` (child
processes), `model` (loads a model the worker's way), `ceiling` (the model alone), `seed_app`
/ `seed_images_app` (the seed pattern), `litserve_app`, `infinity` (Infinity from its own venv),
`floor_app` (the echo path's floors), `systems` (how each server is started), `runner` (the
measurement plan), `report` (table and plot), `main` (the command).
"""
