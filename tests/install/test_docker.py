"""The Docker files: a CPU image with the pinned CPU torch by default (profile ``cpu``), a GPU
variant behind the ``gpu`` profile, batching on in both, a healthcheck that asks ``/readyz``, and
one on each engine's ``/health``. (Parsed, not built: these tests need no Docker daemon; the
healthchecks' commands run here against real servers.)"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from wschat.server.runtime.extras import TORCH_CPU_INDEX, TORCH_PIN

from tests.fakes.scripted import ScriptedEngine
from tests.openai.llama import LlamaServer
from tests.support import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
HEALTHCHECK_TIMEOUT = 30.0


def build_args(service: dict[str, Any]) -> dict[str, str]:
    build = service["build"]
    return {} if isinstance(build, str) else dict(build.get("args", {}))


def dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE, re.MULTILINE))


async def run_healthcheck(service: dict[str, Any], port: int) -> int:
    """The service's healthcheck command, run here against ``port`` instead of its own."""
    kind, program, *args = service["healthcheck"]["test"]
    assert kind == "CMD" and program in ("python", "python3")  # what every image has
    args = [re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", arg) for arg in args]
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, *args], capture_output=True, timeout=HEALTHCHECK_TIMEOUT
    )
    return done.returncode


def test_the_cpu_and_gpu_services_each_have_their_profile() -> None:
    assert set(SERVICES) == {
        "wschat",
        "wschat-gpu",
        *("vllm", "wschat-vllm"),
        *("llamacpp", "wschat-llamacpp"),
        *("redis", "wschat-replica", "haproxy"),  # tests/deploy/test_compose.py
    }
    assert SERVICES["wschat"]["profiles"] == ["cpu"]
    assert SERVICES["wschat-gpu"]["profiles"] == ["gpu"]
    for engine in ("vllm", "llamacpp"):  # an engine and wschat in front of it, together
        assert SERVICES[f"wschat-{engine}"]["profiles"] == [engine]
        assert engine in SERVICES[engine]["profiles"]
        assert SERVICES[f"wschat-{engine}"]["environment"]["WSCHAT_ENGINE_URL"].startswith(
            f"http://{engine}:"
        )
    assert build_args(SERVICES["wschat"]) == {}  # the Dockerfile's default: the CPU build


def test_the_dockerfile_installs_the_pinned_torch_from_the_cpu_index_before_the_server() -> None:
    args = dockerfile_args()
    assert f"torch=={args['TORCH_VERSION']}" == TORCH_PIN
    assert args["TORCH_INDEX_URL"] == TORCH_CPU_INDEX
    torch_line = (
        'pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"'
    )
    assert torch_line in DOCKERFILE
    assert DOCKERFILE.index(torch_line) < DOCKERFILE.index('".[server]"')


def test_the_gpu_service_builds_cuda_torch_and_reserves_an_nvidia_gpu() -> None:
    gpu = SERVICES["wschat-gpu"]
    assert build_args(gpu)["TORCH_INDEX_URL"] == "https://pypi.org/simple"
    assert build_args(gpu)["FLASH_ATTN"] in {"0", "1"}
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert gpu["environment"]["WSCHAT_DEVICE"] == "cuda"


def test_no_service_turns_batching_off() -> None:
    for name, service in SERVICES.items():
        environment = service.get("environment") or {}
        assert environment.get("WSCHAT_ENGINE", "batched") == "batched", name
        assert int(environment.get("WSCHAT_MAX_CONCURRENT", 8)) > 1, name


async def test_the_healthcheck_passes_on_a_ready_server_and_fails_without_one() -> None:
    for name, service in SERVICES.items():
        if not name.startswith("wschat"):  # the engines behind a gateway
            continue
        async with running_server(ScriptedEngine()) as url:
            port = int(url.split(":")[2].split("/")[0])
            assert await run_healthcheck(service, port) == 0, name
        assert await run_healthcheck(service, free_port()) != 0, name


@pytest.mark.parametrize("engine", ["llamacpp", "vllm"])
def test_an_engines_healthcheck_passes_on_a_live_health_endpoint_and_fails_without_one(
    engine: str, live_llama: LlamaServer
) -> None:
    # llama.cpp's server stands in for vLLM: both answer GET /health 200 once loaded
    service = SERVICES[engine]
    assert "/health'" in service["healthcheck"]["test"][-1]
    assert asyncio.run(run_healthcheck(service, live_llama.port)) == 0
    assert asyncio.run(run_healthcheck(service, free_port())) != 0
