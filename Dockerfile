# One image for every Crucible service (api, controller, worker, trainer, vllm).
#   docker build -t crucible .      (needs a registry for the python base image; see README)
FROM python:3.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 CRUCIBLE_DATA_DIR=/data
RUN apt-get update \
 && apt-get install -y --no-install-recommends git debootstrap docker.io curl \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY core core
COPY controller controller
COPY task_workers task_workers
COPY environments environments
COPY trainer trainer
COPY api api
COPY cli cli
COPY migrations migrations
RUN pip install ".[gpu]"

VOLUME /data
ENTRYPOINT ["crucible"]
CMD ["--help"]
