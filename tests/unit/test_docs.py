"""The README's topic examples and the published JSON Schemas stay true to the contracts."""

from __future__ import annotations

import json
import re
from pathlib import Path

from contracts.catalog import CONTRACTS, TOPICS, contracts_markdown, json_schema_text

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_has_one_valid_example_per_topic_and_stays_short() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", readme, flags=re.S)
    expected = [contract for contract, _ in TOPICS.values()]
    assert len(blocks) == len(expected)
    for name, block in zip(expected, blocks, strict=True):
        CONTRACTS[name].model_validate(json.loads(block))
    assert len(readme.encode()) <= 12 * 1024


def test_published_schemas_are_current() -> None:
    for name in CONTRACTS:
        published = ROOT / "docs" / "schemas" / f"{name}.schema.json"
        assert published.read_text() == json_schema_text(name) + "\n", (
            f"{published.name} is stale: run `autoscaler schema --write docs`"
        )


def test_the_contracts_page_is_generated_from_the_models() -> None:
    assert (ROOT / "docs" / "contracts.md").read_text() == contracts_markdown(), (
        "docs/contracts.md is stale: run `autoscaler schema --write docs`"
    )


def test_the_image_copies_every_package_the_project_installs() -> None:
    import tomllib

    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    for pattern in packages:
        name = pattern.rstrip("*")
        assert f"COPY {name}/ {name}/" in dockerfile, f"the Dockerfile does not copy {name}/"
