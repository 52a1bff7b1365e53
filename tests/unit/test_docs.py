"""The README's topic examples and the published JSON Schemas stay true to the contracts."""

from __future__ import annotations

import json
import re
from pathlib import Path

from contracts.catalog import CONTRACTS, contracts_markdown, json_schema_text

ROOT = Path(__file__).resolve().parents[2]


def test_readme_examples_validate_against_their_contracts() -> None:
    blocks = re.findall(r"```json\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    expected = ["metric-report", "scaling-decision", "scaling-event", "dead-letter", "rescale-command"]
    assert len(blocks) == len(expected)
    for name, block in zip(expected, blocks, strict=True):
        CONTRACTS[name].model_validate(json.loads(block))


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
