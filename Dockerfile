# The image of `registry serve` and `registry-storage-initializer` (deploy/helm, deploy/kserve):
# the locked install (requirements/image.lock: serve, signing, traces, PostgreSQL), run as a
# non-root user on a read-only root filesystem (HOME and TMPDIR point at /tmp, a volume).
#   docker build -t modeldir-registry:0.1.0 .
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/image.lock requirements/image.lock
RUN python -m venv /opt/registry \
 && /opt/registry/bin/pip install --no-deps --require-hashes -r requirements/image.lock
COPY pyproject.toml README.md ./
COPY registry registry
COPY modeldir_registry modeldir_registry
COPY schemas schemas
COPY templates templates
COPY migrations migrations
# the package itself, its dependencies already installed from the lock (hatchling, the
# build backend, is fetched into pip's isolated build environment only)
RUN /opt/registry/bin/pip install --no-deps .

FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 registry \
 && useradd --system --uid 10001 --gid registry --home-dir /tmp --shell /usr/sbin/nologin registry
COPY --from=build /opt/registry /opt/registry
ENV PATH=/opt/registry/bin:$PATH HOME=/tmp TMPDIR=/tmp PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["registry"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", "--token-file", "/etc/registry/token/token"]
