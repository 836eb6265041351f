# The pqrl service image used by compose.yaml (where a registry is reachable).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir "torch==2.13.0" && pip install --no-cache-dir /app
CMD ["pqrl", "--help"]
