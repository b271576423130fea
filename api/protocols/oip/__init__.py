"""The Open Inference Protocol (KServe v2, what `tritonclient` speaks): the request and its
tensors (`request`, `tensors`: JSON `data` and the binary extension), bodies in flight
(`body`), server and model metadata (`metadata`), answers and refusals (`response`). The
routes are `inferq.api.routes.oip`."""
