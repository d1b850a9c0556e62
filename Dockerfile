# The CPU image; docker-compose.yml's `gpu` profile builds the CUDA one from this file.
FROM python:3.11-slim
WORKDIR /app
# torch first, pinned, from the index for the target: PyTorch's CPU wheels by default (a bare
# `torch` from PyPI is the multi-GB CUDA build); the gpu profile passes PyPI, whose Linux
# wheels are the CUDA builds.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
# Optional on CUDA: FlashAttention 2, built against the torch above (so no build isolation).
ARG FLASH_ATTN=0
RUN if [ "${FLASH_ATTN}" = 1 ]; then \
      pip install --no-cache-dir packaging psutil ninja \
      && pip install --no-cache-dir --no-build-isolation "flash-attn>=2.6"; \
    fi
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY server ./server
COPY client ./client
RUN pip install --no-cache-dir ".[server]"
ENV WSCHAT_HOST=0.0.0.0 WSCHAT_PORT=8000 WSCHAT_CACHE_DIR=/cache HF_HUB_OFFLINE=1
VOLUME /cache
EXPOSE 8000
CMD ["wschat-server"]
