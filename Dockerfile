# dp-subspace-service image.
#
#   docker build -t dp-subspace-service .
#   docker run -p 8000:8000 -v dpss-data:/var/lib/dpss/data \
#       -e DPSS_ADMIN_API_KEY=... dp-subspace-service          # embedded: SQLite + one worker
#
# The production stack (PostgreSQL, migrations, API, workers) is docker-compose.yml; see
# docs/deployment.md. No secret is baked in: keys and passwords come from the environment.

# ---- build stage: resolve and install everything into a self-contained virtualenv ----------
FROM python:3.11-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/dpss

WORKDIR /src

# Dependencies first, from the two pyproject.toml files alone, so that editing the code does not
# re-download them: this layer changes only when a dependency list does. The server's
# dpss-client requirement is the local clients/python, installed below, not a registry package.
COPY pyproject.toml ./
COPY clients/python/pyproject.toml ./clients/python/
RUN python -c "import tomllib; deps = [d for f in ('pyproject.toml', 'clients/python/pyproject.toml') for d in tomllib.load(open(f, 'rb'))['project']['dependencies'] if not d.startswith('dpss-client')]; print('\n'.join(deps))" \
        > /tmp/requirements.txt \
    && /opt/dpss/bin/pip install -r /tmp/requirements.txt

# Then the two distributions (wheels built from the repository; migrations ship inside the
# server's): the slim client with the wire schemas, then the server.
COPY clients/python ./clients/python
COPY README.md ./
COPY service ./service
RUN /opt/dpss/bin/pip install --no-deps ./clients/python . \
    && /opt/dpss/bin/pip check \
    && /opt/dpss/bin/dpss --help >/dev/null

# The service's Dask configuration (service/reference/dask.yaml: no statistical profiler, slower
# health checks) where Dask reads it at import, {sys.prefix}/etc/dask, so `dask scheduler` and
# `dask worker` from this image (compose's dask profile, a Kubernetes DaskCluster) run with it.
RUN mkdir -p /opt/dpss/etc/dask \
    && cp service/reference/dask.yaml /opt/dpss/etc/dask/dpss.yaml \
    && test "$(/opt/dpss/bin/python -c 'import dask; print(dask.config.get("distributed.worker.profile.enabled"))')" = False

# Nothing below is needed at run time: the bundled test suites of the numerical packages, and
# the installer itself (about 70 MB).
RUN site=$(/opt/dpss/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
    && for pkg in numpy scipy pyarrow randomgen; do \
           find "$site/$pkg" -depth -type d -name tests -exec rm -rf {} +; \
       done \
    && /opt/dpss/bin/python -m pip uninstall --yes --quiet pip setuptools \
    && /opt/dpss/bin/dpss --help >/dev/null

# ---- object-store stage (docker compose --profile dask only): a local S3 endpoint ----------------
# moto's server mode, a stand-in for the deployment's bucket in trials; never the default target.
FROM python:3.11-slim-bookworm AS object-store
RUN pip install --no-cache-dir 'moto[server]>=5.0' \
    && useradd --system --uid 10002 --no-create-home moto
USER moto
EXPOSE 9000
ENTRYPOINT ["moto_server", "-H", "0.0.0.0", "-p", "9000"]

# ---- final stage: the interpreter, the virtualenv and an unprivileged user; no compilers -------
FROM python:3.11-slim-bookworm

RUN groupadd --system --gid 10001 dpss \
    && useradd --system --uid 10001 --gid dpss --home-dir /var/lib/dpss --no-create-home \
        --shell /usr/sbin/nologin dpss \
    && mkdir -p /var/lib/dpss/data /var/lib/dpss/data-state \
    && chown -R dpss:dpss /var/lib/dpss

COPY --from=build /opt/dpss /opt/dpss

ENV PATH=/opt/dpss/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DPSS_DATA_DIR=/var/lib/dpss/data

USER dpss:dpss
WORKDIR /var/lib/dpss

# Dataset files (and, in the embedded mode, the SQLite database) live here. Declared after the
# chown so that a fresh named volume starts owned by the dpss user.
# The audit anchors (DPSS_AUDIT_ANCHOR_PATH default) live beside the data directory, not in it:
# a backup of the data volume must not carry them (a restore would roll them back too).
VOLUME ["/var/lib/dpss/data", "/var/lib/dpss/data-state"]

EXPOSE 8000

# Liveness of the HTTP server; a worker container (no HTTP) disables it in docker-compose.yml.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

ENTRYPOINT ["dpss"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
