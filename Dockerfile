FROM python:3.11-slim
WORKDIR /app
# For a CPU-only image, point pip at a CPU wheel index: --build-arg TORCH_PIP_ARGS="--index-url ..."
ARG TORCH_PIP_ARGS=""
RUN pip install --no-cache-dir ${TORCH_PIP_ARGS} torch
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY server ./server
COPY client ./client
COPY bench ./bench
RUN pip install --no-cache-dir ".[server]"
ENV WSCHAT_HOST=0.0.0.0 WSCHAT_PORT=8000 WSCHAT_CACHE_DIR=/cache HF_HUB_OFFLINE=1
VOLUME /cache
EXPOSE 8000
CMD ["wschat-server"]
