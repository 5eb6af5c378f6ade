"""Test-only extension whose tools try to get their secret setting out of the worker.

Each leak is tagged (``thread`` or ``child``), so that a test can see the scrubbed text
arrive: ``printed [redacted]`` proves the print reached the log, with the secret gone.
"""

from __future__ import annotations

import os
import sys
import warnings

from pydantic import BaseModel, ConfigDict

from toolfleet.shared import Extension, ExtensionContext, Tool
from toolfleet.shared.manifest import SettingSpec

SECRET_ENV = "TFTEST_LEAKY_KEY"


class NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _key(context: ExtensionContext) -> str:
    return str(context.settings.key.get_secret_value())


class BytesForm(Tool):
    """Return, log and report as progress the repr of the secret's UTF-8 bytes."""

    name = "bytes_form"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> dict[str, str]:
        form = f"{_key(context).encode()!r}"
        context.logger.warning("bytes form: %s", form)
        context.progress(f"progress {form}")
        return {"bytes": form, "nested": repr({"key": form})}


class BytesCrash(Tool):
    """Crash with the repr of the secret's UTF-8 bytes in the exception (logged)."""

    name = "bytes_crash"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> None:
        raise RuntimeError(f"crashed with {_key(context).encode()!r}")


def _print_everywhere(secret: str, tag: str) -> str:
    print(f"printed {tag} {secret}")
    sys.stderr.write(f"stderr {tag} ")  # one line in two writes
    sys.stderr.write(f"{secret}\n")
    warnings.warn(f"warned {tag} {secret}", UserWarning, stacklevel=1)
    return "done"


class PrintLeak(Tool):
    """print() the secret, write it to sys.stderr and warnings.warn() it."""

    name = "print_leak"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> str:
        return _print_everywhere(_key(context), "thread")


class PrintLeakInChild(Tool):
    """The same, in a process-isolation child."""

    name = "print_leak_in_child"
    arguments_model = NoArguments
    isolation = "process"

    def call(self, arguments: NoArguments, context: ExtensionContext) -> str:
        return _print_everywhere(_key(context), "child")


class Environ(Tool):
    """Return the worker process's whole environment."""

    name = "environ"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> dict[str, str]:
        return dict(os.environ)


class EnvironInChild(Tool):
    """Return the environment of a process-isolation child."""

    name = "environ_in_child"
    arguments_model = NoArguments
    isolation = "process"

    def call(self, arguments: NoArguments, context: ExtensionContext) -> dict[str, str]:
        return dict(os.environ)


extension = Extension(
    slug="leaky",
    version="1.0.0",
    tools=[BytesForm, BytesCrash, PrintLeak, PrintLeakInChild, Environ, EnvironInChild],
    settings=[SettingSpec(name="key", secret=True, env=SECRET_ENV)],
    event_payloads=True,
)
