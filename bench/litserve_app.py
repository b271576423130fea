"""LitServe with its own batching: the same model behind `litserve.LitServer`.

Batching is set fairly: max_batch_size is inferq's INFERQ_MAX_BATCH_SIZE (32); batch_timeout
is 5 ms, since LitServe needs a timeout > 0 to batch at all (inferq's INFERQ_MAX_WAIT_MS
default is 0: it batches what arrives while the device is busy); BENCH_MAX_BATCH_SIZE /
BENCH_BATCH_TIMEOUT_S override them. One inference worker, as inferq runs one per device.
Run: `python -m inferq.bench.litserve_app PORT` (env BENCH_DEVICE, BENCH_BACKEND).
"""

import os
import sys
from typing import Any

import litserve as ls

from inferq.bench.model import from_env


class MiniLMApi(ls.LitAPI):
    def setup(self, device: str) -> None:
        self.model = from_env()

    # No annotation on `request`: LitServe reads it to build the route's body model.
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return str(request["input"])

    def predict(self, texts: list[str]) -> Any:
        return self.model.run([p.payload for p in self.model.prepare_texts(list(texts))])

    def encode_response(self, output: Any) -> dict[str, Any]:
        return {"status": "succeeded", "output": output.tolist()}


def main(port: int) -> None:
    device = os.environ.get("BENCH_DEVICE", "cpu")
    api = MiniLMApi(
        max_batch_size=int(os.environ.get("BENCH_MAX_BATCH_SIZE", "32")),
        batch_timeout=float(os.environ.get("BENCH_BATCH_TIMEOUT_S", "0.005")),
    )
    server = ls.LitServer(
        api,
        accelerator="cuda" if device.startswith("cuda") else "cpu",
        devices=1,
        workers_per_device=1,
    )
    server.run(host="127.0.0.1", port=port, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main(int(sys.argv[1]))
