# ModelFleet server image: API, compile and publish workers (same image, different command).
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# bubblewrap: every uploaded model is opened only in a sandboxed child (docs/security.md).
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY manifests ./manifests
COPY server ./server
COPY client_sdk ./client_sdk
COPY modelfleet ./modelfleet
COPY migrations ./migrations
# CPU torch first (an unpinned torch pulls a multi-GB CUDA build), then the project.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
 && pip install ".[server,client,compile]" \
 && pip install --no-deps "onnx2torch==1.5.15"
RUN useradd --system --uid 10001 modelfleet && mkdir -p /data && chown modelfleet /data
USER modelfleet
EXPOSE 8000
CMD ["modelfleet", "serve", "--data-dir", "/data", "--host", "0.0.0.0", "--port", "8000"]
