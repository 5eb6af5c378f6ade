"""Load an extension's declared settings (pydantic-settings): env vars and mounted secret files.

Each setting reads the environment variable its manifest names, else
``TOOLFLEET_EXT_<SLUG>_<NAME>``; a file of that name in the secrets directory
(``TOOLFLEET_SECRETS_DIR``, e.g. a mounted Kubernetes Secret) is read too. Secret settings
are ``SecretStr``: their values print as ``**********`` and are scrubbed from replies and logs;
a secret value too short to scrub safely is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, Field, SecretStr, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.extension import Extension
from toolfleet.shared.manifest import SETTING_TYPES, SettingSpec
from toolfleet.shared.naming import sanitize_slug
from toolfleet.worker.registry.redaction import MIN_SECRET_CHARS

__all__ = ["env_name", "load_settings", "secret_values"]


def env_name(slug: str, setting: SettingSpec) -> str:
    """The environment variable (and secret file name) of one setting."""
    return setting.env or f"TOOLFLEET_EXT_{sanitize_slug(slug).upper()}_{setting.name.upper()}"


def load_settings(extension: Extension, secrets_dir: Path | None = None) -> BaseModel | None:
    """Read ``extension``'s settings; ``None`` when it declares none.

    Raises:
        ConfigurationError: a required setting is missing, a value has the wrong type, or
            a secret value is shorter than
            :data:`~toolfleet.worker.registry.redaction.MIN_SECRET_CHARS` characters (too
            short to scrub from text without mangling it, so it could not be kept out of
            logs and replies); the message names the variable, never a value.
    """
    if not extension.settings:
        return None
    fields: dict[str, Any] = {}
    for setting in extension.settings:
        python_type: Any = SecretStr if setting.secret else SETTING_TYPES[setting.type]
        variable = env_name(extension.slug, setting)
        default: Any = ... if setting.default is None else setting.default
        fields[setting.name] = (
            python_type,
            Field(
                default, validation_alias=AliasChoices(variable), description=setting.description
            ),
        )
    directory = str(secrets_dir) if secrets_dir and secrets_dir.is_dir() else None
    model = create_model(
        f"{sanitize_slug(extension.slug)}_settings",
        __base__=BaseSettings,
        __config__=None,
        **fields,
    )
    model.model_config = SettingsConfigDict(
        extra="ignore", secrets_dir=directory, case_sensitive=True, populate_by_name=False
    )
    try:
        loaded: BaseModel = model()
    except ValidationError as exc:
        names = {s.name: env_name(extension.slug, s) for s in extension.settings}
        problems = "; ".join(
            f"setting {e['loc'][0]} ({names.get(str(e['loc'][0]), '?')}): {e['msg']}"
            for e in exc.errors(include_input=False)
        )
        raise ConfigurationError(f"extension {extension.slug!r}: {problems}") from None
    short = [
        f"{s.name} ({env_name(extension.slug, s)})"
        for s in extension.settings
        if s.secret and 0 < len(_plain(getattr(loaded, s.name))) < MIN_SECRET_CHARS
    ]
    if short:
        raise ConfigurationError(
            f"extension {extension.slug!r}: secret setting {', '.join(short)} is shorter than "
            f"{MIN_SECRET_CHARS} characters, too short to redact safely; use a longer value"
        )
    return loaded


def _plain(value: Any) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value or "")


def secret_values(settings: BaseModel | None) -> set[str]:
    """The plain values of every ``SecretStr`` field (for scrubbing); empty strings skipped."""
    if settings is None:
        return set()
    found = set()
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr) and value.get_secret_value():
            found.add(value.get_secret_value())
    return found
