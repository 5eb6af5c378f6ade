"""Test-only extension with a secret setting, an allow-list and switches."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from toolfleet.shared import Extension, ExtensionContext, ExtensionToolError, Tool
from toolfleet.shared.manifest import Availability, SettingSpec, SwitchSpec

SECRET_ENV = "TFTEST_GUARDED_API_KEY"


class NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Leak(Tool):
    """Return the secret (it must come back redacted)."""

    name = "leak"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> dict[str, str]:
        key = context.settings.api_key.get_secret_value()
        context.logger.warning("using key %s", key)
        return {"key": key, "repr": repr(context.settings)}


class LeakInError(Tool):
    """Fail with the secret in the message."""

    name = "leak_in_error"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> None:
        raise ExtensionToolError(f"bad key {context.settings.api_key.get_secret_value()}")


class LeakInCrash(Tool):
    """Crash with the secret in the exception."""

    name = "leak_in_crash"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> None:
        raise RuntimeError(f"cannot use {context.settings.api_key.get_secret_value()}")


class Mode(Tool):
    """Report the state of the extension's `loud` switch and the account."""

    name = "mode"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> dict[str, object]:
        return {"loud": context.switch_is_active("loud"), "account": context.account}


class Dormant(Tool):
    """Answer while the `dormant` switch, off unless turned on, is on."""

    name = "dormant"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> str:
        return "awake"


extension = Extension(
    slug="guarded",
    version="1.0.0",
    tools=[Leak, LeakInError, LeakInCrash, Mode, Dormant],
    settings=[SettingSpec(name="api_key", secret=True, env=SECRET_ENV)],
    switches=[SwitchSpec(name="loud", default=False), SwitchSpec(name="dormant", default=False)],
    availability=Availability(accounts_allowed=["acme", "globex"], accounts_denied=["globex"]),
)
