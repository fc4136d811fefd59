# ditserve on NVIDIA Triton: build with `docker build -t ditserve:latest .` (see docs/docker.md).
# Triton 24.10 = tritonserver 2.51, the release of the nvidia-pytriton 0.7.0 wheel we test
# with on CPU. The image has Ubuntu 22.04, Python 3.10, CUDA 12.6, curl, and user triton-server.
FROM nvcr.io/nvidia/tritonserver:24.10-py3

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Runtime dependencies, into the image's python3: the Python backend's stub imports from
# the site-packages of the first python3 on PATH (it ignores PYTHONPATH).
# - torch 2.7.1: its default PyPI wheel is the CUDA 12.6 build, the same CUDA as this image,
#   so it needs no newer driver than Triton 24.10 itself. Not 2.5.x: transformers 5 disables
#   torch < 2.6 ("Disabling PyTorch because PyTorch >= 2.6 is required") and diffusers wants >= 2.6.
# - diffusers 0.41.0 and transformers 5.20.2 are the last releases for Python 3.10.
# - numpy 1.26.4 (< 2): with numpy 2, Triton 2.51's Python backend silently sends EMPTY
#   tensors built from numpy arrays.
# - tomli: Python 3.10 has no tomllib.
# - tritonclient/pillow/tqdm: scripts/generate.py can call the server from inside the container.
# - fastapi/uvicorn/python-multipart: the OpenAI-compatible front end (`python3 -m frontend`,
#   docs/frontend.md), run as a second container of the pod; the newest releases for Python 3.10.
RUN python3 -m pip install --no-cache-dir \
        torch==2.7.1 \
        numpy==1.26.4 \
        diffusers==0.41.0 \
        transformers==5.20.2 \
        safetensors==0.8.0 \
        accelerate==1.15.0 \
        sentencepiece==0.2.3 \
        protobuf==6.33.6 \
        tomli==2.5.0 \
        "tritonclient[grpc,http]==2.73.0" \
        pillow==12.3.0 \
        tqdm==4.70.1 \
        fastapi==0.162.5 \
        uvicorn==0.54.0 \
        python-multipart==0.0.32

WORKDIR /opt/ditserve
COPY pyproject.toml ./
COPY backends/ backends/
COPY model_repository/ model_repository/
COPY configs/ configs/
COPY scripts/ scripts/
COPY frontend/ frontend/

# Editable install (deps installed above): `ditserve` imports from /opt/ditserve/backends,
# so relative paths in deployment configs resolve against /opt/ditserve as in a checkout.
# Triton finds a Python-based backend as <backend-directory>/<name>/model.py, beside python/.
# The home folder holds caches (HF_HOME; torch); triton-server's has none in the base image.
RUN python3 -m pip install --no-cache-dir --no-deps -e /opt/ditserve \
    && ln -s /opt/ditserve/backends/diffusion /opt/tritonserver/backends/diffusion \
    && python3 scripts/render_repository.py --deployment configs/pixart-sigma-1024.toml \
        --out /opt/ditserve/model_repository_gpu \
    && install -d -o triton-server -g triton-server /home/triton-server /home/triton-server/.cache/huggingface \
        /var/cache/ditserve /var/cache/ditserve/inductor

# The real-checkpoint GPU deployment. Its [model] path is a hub id (needs network on first
# load) unless you mount a checkpoint and, over this config, a config naming it (docs/docker.md).
# HF_HUB_OFFLINE is left to the user.
# TORCHINDUCTOR_CACHE_DIR: the deployment's [accel] compiles the transformer while the model
# loads (minutes the first time); mount a volume here (docs/docker.md) and a restart reuses it.
ENV DITSERVE_DEPLOYMENT=/opt/ditserve/configs/pixart-sigma-1024.toml \
    HF_HOME=/home/triton-server/.cache/huggingface \
    TORCHINDUCTOR_CACHE_DIR=/var/cache/ditserve/inductor \
    PYTHONUNBUFFERED=1
VOLUME ["/var/cache/ditserve"]

# triton-server (uid/gid 1000 in every Triton image); numeric, so Kubernetes' runAsNonRoot can check it.
USER 1000:1000

# HTTP, gRPC, metrics; 8080: the front end, when the container runs `python3 -m frontend`.
EXPOSE 8000 8001 8002 8080

# Healthy = ready AND every model instance's Python stub alive: Triton 2.51 keeps reporting
# READY after a stub dies (docs/reliability.md), so readiness alone would stay green.
# Loading a full checkpoint (or downloading it) takes minutes: a long start period.
HEALTHCHECK --interval=30s --timeout=10s --start-period=15m --retries=3 \
    CMD ["/bin/sh", "-c", "curl -fsS http://localhost:8000/v2/health/ready && python3 /opt/ditserve/scripts/check_stubs.py --url 127.0.0.1:8000"]

# The base image's ENTRYPOINT (/opt/nvidia/nvidia_entrypoint.sh) runs this command.
# model_repository_gpu is model_repository rendered for the GPU deployment's capacity.
CMD ["tritonserver", "--model-repository=/opt/ditserve/model_repository_gpu"]
