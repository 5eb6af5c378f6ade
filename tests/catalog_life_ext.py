"""Test-only extensions for the catalog's life: a tool renamed between two versions, an
extension that is removed, and two extensions of two fleets whose tools map to one name
(``a``/``b_c`` and ``a-b``/``c`` are both ``ext_a_b_c``). Each tool answers which tool
and version it is."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared import Extension, ExtensionContext, Tool


class NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WhoAmI(Tool):
    """Say which extension, tool and version answered."""

    name = "who"
    arguments_model = NoArguments

    def call(self, arguments: BaseModel, context: ExtensionContext) -> str:
        return f"{context.slug}/{self.name}@{context.version}"


class OldName(WhoAmI):
    """Say which tool answered (the name version 1 used)."""

    name = "old_name"


class NewName(WhoAmI):
    """Say which tool answered (the name version 2 uses)."""

    name = "new_name"


class BC(WhoAmI):
    """Say which tool answered: extension a, tool b_c."""

    name = "b_c"


class C(WhoAmI):
    """Say which tool answered: extension a-b, tool c."""

    name = "c"


class Sized(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(description="A size.")


class SizedV2(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(description="A size, in metres.")
    unit: str = Field(default="m", description="The unit.")


class Measure(WhoAmI):
    """Say which version measured."""

    name = "measure"
    arguments_model = Sized


class MeasureV2(Measure):
    """Say which version measured."""

    arguments_model = SizedV2


ren_v1 = Extension(slug="ren", version="1.0.0", tools=[OldName, Measure])
ren_v2 = Extension(slug="ren", version="2.0.0", tools=[NewName, MeasureV2])
gone = Extension(slug="gone", version="1.0.0", tools=[WhoAmI])
a = Extension(slug="a", version="1.0.0", tools=[BC])
a_b = Extension(slug="a-b", version="1.0.0", tools=[C])
