# deepmem: context-compression reverse proxy for LLM APIs.
#
#   docker build -t deepmem .
#   docker run -p 127.0.0.1:8787:8787 -v deepmem-data:/data -v "$PWD":/workspace deepmem \
#       --upstream https://api.openai.com/v1
#
# Arguments after the image name are appended to `deepmem serve --host 0.0.0.0`.
# The HEALTHCHECK targets port 8787; if you change the port (--port / DEEP_MEMORY_PORT),
# override it too (docker run --health-cmd ...).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    DEEP_MEMORY_DATA_DIR=/data \
    DEEP_MEMORY_ALLOWED_ROOTS=/workspace

# Numeric uid/gid so that Kubernetes' runAsNonRoot can verify the user.
RUN groupadd --system --gid 10001 deepmem \
    && useradd --system --uid 10001 --gid deepmem --home-dir /home/deepmem --create-home \
        --shell /usr/sbin/nologin deepmem \
    && mkdir -p /data /workspace \
    && chown deepmem:deepmem /data /workspace

# Only what the package build needs; the source tree is removed after the install.
WORKDIR /tmp/deepmem-src
COPY pyproject.toml README.md ./
COPY proxy/ proxy/
COPY compressors/ compressors/
COPY memory/ memory/
RUN pip install --no-cache-dir . \
    && rm -rf /tmp/deepmem-src

WORKDIR /workspace
USER 10001:10001

# Declared after the chown so that new volumes start out owned by the deepmem user.
VOLUME ["/data", "/workspace"]

EXPOSE 8787

# /health answers 503 when the proxy is degraded (e.g. /data not writable); urlopen raises on
# any non-2xx answer or connection error, so python exits 1 (unhealthy).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/health', timeout=4)"]

ENTRYPOINT ["deepmem", "serve", "--host", "0.0.0.0"]
