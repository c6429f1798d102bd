# syntax=docker/dockerfile:1
# tierflow image. CPU by default; the GPU variant is the same file with a CUDA build of torch:
#   docker build -t tierflow:cpu .
#   docker build -t tierflow:gpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 .
# CUDA wheels of torch bring the CUDA runtime, cuBLAS and cuDNN as pip packages and the NVIDIA container
# toolkit mounts the driver, so an nvidia/cuda base would only add a second copy of those libraries.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, from the variant's index, so nothing later pulls the default build from PyPI.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY deploy/requirements.lock /tmp/requirements.lock
RUN pip install -r /tmp/requirements.lock
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pipeline ./pipeline
COPY workers ./workers
COPY schemas ./schemas
RUN pip install --no-deps . && pip check

FROM ${PYTHON_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# The source commit, for `tierflow --version` and tierflow_build_info (the image has no .git):
# docker build --build-arg TIERFLOW_BUILD_COMMIT=$(git rev-parse --short=12 HEAD) .
ARG TIERFLOW_BUILD_COMMIT=unknown
LABEL org.opencontainers.image.title="tierflow" \
      org.opencontainers.image.description="Kafka-driven hybrid inference: ingest, tier workers, feedback" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.tierflow.torch-index="${TORCH_INDEX_URL}"
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/tierflow tierflow
COPY --from=build /opt/venv /opt/venv
# Models ship inside wheels: nothing is downloaded at run time. Caches go to /tmp so the root
# filesystem can be read-only (k8s mounts an emptyDir there). No NVIDIA_VISIBLE_DEVICES here: a CPU
# pod must not see GPUs on a node whose default runtime is nvidia.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    HF_HOME=/tmp/hf \
    XDG_CACHE_HOME=/tmp/cache \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    TIERFLOW_METRICS_PORT=9100 \
    TIERFLOW_DATA_DIR=/tmp/tierflow \
    TIERFLOW_LOG_JSON=true \
    TIERFLOW_BUILD_COMMIT=${TIERFLOW_BUILD_COMMIT}
USER 10001:10001
WORKDIR /home/tierflow
EXPOSE 9100
CMD ["tierflow", "--help"]
