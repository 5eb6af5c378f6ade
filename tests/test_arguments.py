"""The argument parsing policy (unit tests of one function)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from toolfleet.shared.errors import InvalidArgumentsError
from toolfleet.worker.pipeline.arguments import parse_arguments


class Binomial(BaseModel):
    n: int
    k: int
    p: float


class Empty(BaseModel):
    pass


class Vector(BaseModel):
    values: list[float]


def _error(raw: object, model: type[BaseModel] = Binomial) -> str:
    with pytest.raises(InvalidArgumentsError) as info:
        parse_arguments(raw, model)  # type: ignore[arg-type]
    return str(info.value)


def test_truncated_json_is_refused_not_repaired() -> None:
    """Truncated JSON is an error saying where parsing stopped, never {}."""
    assert "column" in _error('{"n": 450, "k": 3')


def test_trailing_comma_is_refused() -> None:
    """A trailing comma is not JSON."""
    assert "not valid JSON" in _error('{"n": 7,}')


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ('{"n": 1, "k": 1, "p": 0.5} extra', "line 1 column 28"),
        ('{"n": 1, "k": 1, "p": 0.5}{"n": 2}', "line 1 column 27"),
        ('{"n": 1, "k": 1, "p": 0.5}\n{"n": 2}', "line 2 column 1"),
    ],
)
def test_trailing_data_after_the_arguments_is_refused_saying_where(raw: str, where: str) -> None:
    """Anything but whitespace after the arguments' JSON value is invalid_arguments saying
    where parsing stopped; the first value is not taken."""
    message = _error(raw)
    assert message.startswith("arguments are not valid JSON: "), message
    assert where in message, message


def test_double_encoded_object_is_unwrapped_once() -> None:
    """A JSON string holding the object is decoded once more."""
    assert parse_arguments('"{\\"n\\": 1, \\"k\\": 1, \\"p\\": 0.5}"', Binomial) == Binomial(
        n=1, k=1, p=0.5
    )


def test_array_sent_as_string_is_decoded() -> None:
    """A nested array sent as a JSON string where the schema wants an array is decoded."""
    assert parse_arguments({"values": "[1, 2.5]"}, Vector).values == [1.0, 2.5]  # type: ignore[attr-defined]


def test_a_string_that_is_no_array_where_one_is_wanted_names_the_field() -> None:
    """ "1, 2" where an array is wanted names the field, never a TypeError."""
    assert _error({"values": "1, 2"}, Vector).startswith("values: ")


@pytest.mark.parametrize("raw", ["", "null", None, "{}", {}])
def test_empty_forms_run_a_tool_without_parameters(raw: object) -> None:
    """ "", "null", null and "{}" mean no arguments for a tool without parameters."""
    assert parse_arguments(raw, Empty) == Empty()  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["null", "[]", "5"])
def test_non_objects_are_refused_for_a_tool_with_parameters(raw: str) -> None:
    """Anything but an object is refused with a clear message."""
    assert "arguments must be a JSON object" in _error(raw)


def test_numbers_as_strings_are_coerced() -> None:
    """Lax mode accepts "20" for an integer."""
    assert parse_arguments({"n": "20", "k": "5", "p": "0.6"}, Binomial) == Binomial(
        n=20, k=5, p=0.6
    )


def test_uncoercible_value_names_the_field() -> None:
    """ "abc" for an integer names the field."""
    assert _error({"n": "abc", "k": 1, "p": 0.5}).startswith("n: ")


def test_missing_and_extra() -> None:
    """Missing is "p: field required"; extra is "unexpected argument: verbose"."""
    assert _error({"n": 1, "k": 1}) == "p: field required"
    assert _error({"n": 1, "k": 1, "p": 0.5, "verbose": True}) == "unexpected argument: verbose"


class Inner(BaseModel):
    size: int = 20


class Outer(BaseModel):
    inner: Inner
    items: list[Inner] = []
    limit: int = 5
    note: str | None = "x"


def test_null_for_a_defaulted_argument_means_left_out() -> None:
    """Strict-mode null for an optional non-nullable argument takes the default, at every level."""
    parsed = parse_arguments(
        {"inner": {"size": None}, "items": [{"size": None}], "limit": None, "note": None}, Outer
    )
    assert parsed == Outer(inner=Inner(size=20), items=[Inner(size=20)], limit=5, note=None)


def test_null_for_a_required_argument_is_still_refused() -> None:
    """null where a value is required stays an error naming the field."""
    assert _error({"n": None, "k": 1, "p": 0.5}).startswith("n: ")
