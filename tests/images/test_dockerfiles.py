"""The images: each one's entrypoint is the `loom` command the e2e pods run, the operator image
pins exactly pyproject's light dependencies, their names are the chart's and the renderer's
defaults, and `make images` says so plainly where no container engine runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from loom_operator.k8s.settings import RenderSettings

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
# The runtime's (tensors, images, video, grammars): the operator and router never import them.
HEAVY = {"torch", "safetensors", "pillow", "av", "xgrammar", "transformers"}


def dockerfile(name: str) -> str:
    return (IMAGES / name / "Dockerfile").read_text()


@pytest.mark.parametrize("name", ["operator", "runtime-cpu", "runtime-cuda"])
def test_every_image_starts_the_loom_command(name: str) -> None:
    (entrypoint,) = re.findall(r"^ENTRYPOINT (.+)$", dockerfile(name), re.M)
    assert json.loads(entrypoint) == list(RenderSettings().loom)
    assert re.search(r"^USER 65532", dockerfile(name), re.M), "images run as a non-root user"


def test_the_operator_image_pins_exactly_the_light_dependencies() -> None:
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    light = {d for d in pinned if d.split("==")[0] not in HEAVY}
    installed = set(re.findall(r"\b([a-z][a-z0-9-]*==[0-9][^\s\\\"]*)", dockerfile("operator")))
    assert installed == light


def test_the_cpu_runtime_image_pins_exactly_the_projects_dependencies() -> None:
    pinned = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    installed = set(re.findall(r"\b([a-z][a-z0-9-]*==[0-9][^\s\\\"]*)", dockerfile("runtime-cpu")))
    assert installed - {"nixl-cu12==1.5.1"} == pinned


def test_images_are_built_from_the_debian_base_with_the_ca_as_a_secret() -> None:
    for name in ("operator", "runtime-cpu", "runtime-cuda"):
        text = dockerfile(name)
        assert re.search(r"^FROM \$\{BASE\}$", text, re.M), "no Docker Hub base"
        for line in re.findall(r"PIP_CERT=\S+", text):
            assert line == "PIP_CERT=/run/secrets/ca-bundle"  # a BuildKit secret, in no layer
        assert "COPY" not in text and "ca-certificates.crt" not in text


def test_the_runtime_images_pin_the_projects_torch() -> None:
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [d for d in pinned if d.startswith("torch==")]
    for name in ("runtime-cpu", "runtime-cuda"):
        assert torch in dockerfile(name)


def test_the_chart_and_the_renderer_name_the_images_make_images_builds() -> None:
    values = yaml.safe_load((ROOT / "charts" / "loom" / "values.yaml").read_text())["image"]
    chart = yaml.safe_load((ROOT / "charts" / "loom" / "Chart.yaml").read_text())
    tag = chart["appVersion"]
    defaults = RenderSettings()
    assert (
        f"{values['operator']['repository']}:{values['operator']['tag']}" == defaults.router_image
    )
    assert f"{values['runtime']['repository']}:{values['runtime']['tag']}" == defaults.runtime_image
    script = (IMAGES / "build.sh").read_text()
    for built in ("loom-operator:$TAG", "loom-runtime:$TAG", "loom-runtime:$TAG-cuda"):
        assert built in script
    assert values["operator"]["tag"] == tag == values["runtime"]["tag"]


def test_make_images_says_so_where_no_engine_runs_or_can_start(tmp_path: Path) -> None:
    for tool in ("dirname", "sed", "date"):  # what the script needs besides an engine
        (tmp_path / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    # No engine answers (Debian's client, if here, dials a socket nobody serves), and starting one
    # is ruled out: the script must stop and say so.
    env = dict(os.environ, PATH=str(tmp_path), CONTAINER_ENGINE="", LOOM_NO_ENGINE_START="1",
               DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")  # fmt: skip
    out = subprocess.run(["/bin/bash", str(IMAGES / "build.sh")], capture_output=True, text=True,
                         env=env, timeout=30)  # fmt: skip
    assert out.returncode == 1
    assert "no Docker or Podman engine answers on this machine" in out.stderr
    assert "none can be installed or started" in out.stderr


def test_the_build_context_holds_every_package_the_images_install() -> None:
    """`pip install /src` in an image installs what pyproject finds; .dockerignore must let each
    of those folders into the build context, or a worker fails at import in its pod."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = pyproject["tool"]["setuptools"]["packages"]["find"]["where"]
    allowed = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}  # fmt: skip
    assert set(folders) <= allowed, set(folders) - allowed
