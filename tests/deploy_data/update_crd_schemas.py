"""Re-create the CRD JSON schemas in this folder from their npm packages.

Run by hand (needs ``npm`` and the npm registry); the tests only read the JSON files::

    python tests/deploy_data/update_crd_schemas.py

Sources (``npm pack``, nothing installed, no JavaScript run):

- ``@kubernetes-models/keda@0.3.2``: KEDA v2.10.1 CRDs (``ScaledObject``,
  ``TriggerAuthentication``);
- ``@kubernetes-models/prometheus-operator@4.0.0``: prometheus-operator v0.57.0 CRDs
  (``PodMonitor``, ``PrometheusRule``);
- ``@kubernetes-models/apimachinery@1.2.2``: ``ObjectMeta`` and what it references.

These are the newest releases that carry each schema as a JSON literal
(``const schema = {...}``); later releases ship only precompiled validator code. Each
output file is one self-contained JSON Schema: the kind's schema with every ``$ref``
(``"io.k8s...ObjectMeta#"``) rewritten to ``#/$defs/<id>`` and the referenced schemas
copied under ``$defs``. Nothing else is changed (OpenAPI's ``nullable`` stays as it is).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PACKAGES = {
    "keda": "@kubernetes-models/keda@0.3.2",
    "prometheus-operator": "@kubernetes-models/prometheus-operator@4.0.0",
    "apimachinery": "@kubernetes-models/apimachinery@1.2.2",
}
#: output file -> (package key, file inside the package)
KINDS = {
    "keda.sh_v1alpha1_ScaledObject.json": ("keda", "keda.sh/v1alpha1/ScaledObject.js"),
    "keda.sh_v1alpha1_TriggerAuthentication.json": (
        "keda",
        "keda.sh/v1alpha1/TriggerAuthentication.js",
    ),
    "monitoring.coreos.com_v1_PodMonitor.json": (
        "prometheus-operator",
        "monitoring.coreos.com/v1/PodMonitor.js",
    ),
    "monitoring.coreos.com_v1_PrometheusRule.json": (
        "prometheus-operator",
        "monitoring.coreos.com/v1/PrometheusRule.js",
    ),
}
_REGISTER = re.compile(r'register\)\("([^"]+)", schema\)')
_SCHEMA_ID = re.compile(r'const schemaId = "([^"]+)"')


def _schema_literal(text: str) -> Any:
    start = text.index("const schema = ") + len("const schema = ")
    value, _end = json.JSONDecoder().raw_decode(text[start:])
    return value


def _unpack(spec: str, into: Path) -> Path:
    out = subprocess.run(
        ["npm", "pack", spec, "--silent", "--pack-destination", str(into)],
        check=True,
        capture_output=True,
        text=True,
    )
    tgz = into / out.stdout.strip().splitlines()[-1]
    target = into / tgz.stem
    with tarfile.open(tgz) as archive:
        archive.extractall(target, filter="data")
    return target / "package"


def _apimachinery_schemas(package: Path) -> dict[str, Any]:
    found = {}
    for path in sorted((package / "_schemas").glob("*.js")):
        text = path.read_text()
        match = _REGISTER.search(text)
        if match and "const schema = " in text:
            found[match.group(1)] = _schema_literal(text)
    return found


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rstrip("#")} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node)) if node else set()
    return set()


def _rewrite(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (f"#/$defs/{v.rstrip('#')}" if k == "$ref" else _rewrite(v)) for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rewrite(v) for v in node]
    return node


def bundle(root: Any, schema_id: str, library: dict[str, Any], source: str) -> dict[str, Any]:
    """One self-contained schema: ``root`` plus every schema it references, under ``$defs``."""
    defs: dict[str, Any] = {}
    todo = sorted(_refs(root))
    while todo:
        ref = todo.pop()
        if ref in defs:
            continue
        defs[ref] = library[ref]
        todo += sorted(_refs(library[ref]) - set(defs))
    out = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id,
        "$comment": f"extracted from the npm package {source} by update_crd_schemas.py",
    }
    out.update(_rewrite(root))
    out["$defs"] = {k: _rewrite(v) for k, v in sorted(defs.items())}
    return out


def main() -> int:
    """Download, extract and write every schema file."""
    with tempfile.TemporaryDirectory() as tmp:
        unpacked = {key: _unpack(spec, Path(tmp)) for key, spec in PACKAGES.items()}
        library = _apimachinery_schemas(unpacked["apimachinery"])
        for name, (key, inner) in KINDS.items():
            text = (unpacked[key] / inner).read_text()
            match = _SCHEMA_ID.search(text)
            if match is None:
                raise SystemExit(f"{inner}: no schemaId")
            schema = bundle(_schema_literal(text), match.group(1), library, PACKAGES[key])
            (HERE / name).write_text(json.dumps(schema, indent=1, sort_keys=False) + "\n")
            print(f"wrote {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
