"""The ``bfcl`` extension against BFCL's exec data and the FUNCTIONS.md specification.

The expected results live in the folder ``TOOLFLEET_BFCL_DIR`` names (outside the repository);
the data-driven tests skip with a message saying so when it is not set or lacks them.
"""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from conftest import BFCL_DATA, bfcl_unavailable
from toolfleet.extensions.bfcl import TOOLS, extension
from toolfleet.extensions.bfcl.geometry import PolygonArea, PolygonAreaArguments
from toolfleet.shared import ExtensionContext, ExtensionToolError, Status, Tool
from toolfleet.testing import run_tool
from toolfleet.worker.devtools.replay_match import bit_exact

EXPECTED = Path("derived") / "BFCL_v3_exec_expected_results.jsonl"
EXPECTED_FILE = None if BFCL_DATA is None else BFCL_DATA / EXPECTED
REL_TOL = 1e-9

TOOLS_BY_NAME: dict[str, type[Tool]] = {tool.name: tool for tool in TOOLS}

OFFLINE_NAMES = {
    "add_binary_numbers",
    "book_room",
    "calc_binomial_probability",
    "calculate_cosine_similarity",
    "calculate_density",
    "calculate_displacement",
    "calculate_electrostatic_potential_energy",
    "calculate_final_velocity",
    "calculate_future_value",
    "calculate_investment_value",
    "calculate_mean",
    "calculate_nutritional_needs",
    "calculate_permutations",
    "calculate_standard_deviation",
    "calculate_triangle_area",
    "estimate_derivative",
    "geometry_area_circle",
    "get_distance",
    "get_fibonacci_number",
    "get_fibonacci_sequence",
    "get_prime_factors",
    "linear_regression",
    "mat_mul",
    "math_factorial",
    "math_gcd",
    "math_lcm",
    "maxPoints",
    "mortgage_calculator",
    "order_food",
    "polygon_area",
    "quadratic_roots",
    "sort_array",
}


def _offline_calls() -> list[dict[str, Any]]:
    """Every offline call of the derived file, with its entry id; [] without the data."""
    if EXPECTED_FILE is None or not EXPECTED_FILE.is_file():
        return []
    calls: list[dict[str, Any]] = []
    with EXPECTED_FILE.open(encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            entry = json.loads(line)
            for call in entry["calls"]:
                if call["offline"]:
                    calls.append({"id": entry["id"], **call})
    return calls


OFFLINE_CALLS = _offline_calls()
CALL_PARAMS = [
    pytest.param(call, id=f"{call['id']}-{call['index']}-{call['name']}") for call in OFFLINE_CALLS
] or [pytest.param(None, id="no-bfcl-data")]


def _context(function: str) -> ExtensionContext:
    return ExtensionContext(
        call_id="t", function=function, slug="bfcl", version="1", deadline=time.time() + 60
    )


def _run(name: str, arguments: dict[str, Any]) -> Any:
    """Validate ``arguments`` with the tool's model and call the tool directly."""
    tool = TOOLS_BY_NAME[name]
    assert tool.arguments_model is not None
    parsed = tool.arguments_model.model_validate(arguments)
    return tool().call(parsed, _context(extension.function_name(tool)))


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "dict"
    if value is None:
        return "null"
    return type(value).__name__


def _mismatch(actual: Any, expected: Any, path: str = "$") -> str | None:
    """Why ``actual`` does not match ``expected`` (floats to REL_TOL), or None."""
    kind = _json_type(expected)
    if _json_type(actual) != kind:
        return f"{path}: type {_json_type(actual)} ({actual!r}), expected {kind} ({expected!r})"
    if kind == "float":
        if not math.isclose(actual, expected, rel_tol=REL_TOL, abs_tol=0.0):
            return f"{path}: {actual!r} is not within {REL_TOL} of {expected!r}"
        return None
    if kind == "list":
        if len(actual) != len(expected):
            return f"{path}: length {len(actual)}, expected {len(expected)}"
        for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
            if (reason := _mismatch(got, want, f"{path}[{index}]")) is not None:
                return reason
        return None
    if kind == "dict":
        if set(actual) != set(expected):
            return f"{path}: keys {sorted(actual)}, expected {sorted(expected)}"
        for key, want in expected.items():
            if (reason := _mismatch(actual[key], want, f"{path}.{key}")) is not None:
                return reason
        return None
    if actual != expected:
        return f"{path}: {actual!r}, expected {expected!r}"
    return None


# --------------------------------------------------------------------------- extension


def test_extension_is_valid_and_complete() -> None:
    extension.validate()
    assert extension.slug == "bfcl"
    assert {tool.name for tool in TOOLS} == OFFLINE_NAMES
    assert len(TOOLS) == 32
    for tool in TOOLS:
        assert tool.problems() == []
        schema = tool.parameters()
        assert schema["type"] == "object"
        assert schema.get("additionalProperties") is False, tool.name
        for name, prop in schema["properties"].items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"
    assert extension.function_name(TOOLS_BY_NAME["maxPoints"]) == "ext_bfcl_maxPoints"


# --------------------------------------------------------------------------- the BFCL data


@pytest.mark.parametrize("case", CALL_PARAMS)
def test_offline_call_matches_reference(case: dict[str, Any] | None) -> None:
    if case is None:
        bfcl_unavailable(str(EXPECTED))
    name, arguments = case["name"], case["arguments"]
    assert name in TOOLS_BY_NAME, f"no bfcl tool named {name}"
    # The JSON text of the arguments must validate to the same values as the object.
    model = TOOLS_BY_NAME[name].arguments_model
    assert model is not None
    assert model.model_validate_json(json.dumps(arguments)) == model.model_validate(arguments)
    if "expected_result" in case:
        result = _run(name, arguments)
        reason = _mismatch(result, case["expected_result"])
        assert reason is None, f"{case['id']} call {case['index']} {name}: {reason}"
    else:
        assert case["expected_status"] == "tool_error"
        with pytest.raises(ExtensionToolError):
            _run(name, arguments)


def test_offline_data_counts() -> None:
    if not OFFLINE_CALLS:
        bfcl_unavailable(str(EXPECTED))
    with_result = [call for call in OFFLINE_CALLS if "expected_result" in call]
    with_status = [call for call in OFFLINE_CALLS if "expected_status" in call]
    assert (len(OFFLINE_CALLS), len(with_result), len(with_status)) == (206, 202, 4)
    assert {call["name"] for call in OFFLINE_CALLS} == OFFLINE_NAMES - {"get_fibonacci_number"}


@pytest.mark.skipif(
    platform.machine().lower() not in {"x86_64", "amd64"} or platform.libc_ver()[0] != "glibc",
    reason="the expected floats were computed with glibc's libm on x86-64",
)
def test_offline_results_arebit_exact() -> None:
    if not OFFLINE_CALLS:
        bfcl_unavailable(str(EXPECTED))
    checked = [call for call in OFFLINE_CALLS if "expected_result" in call]
    inexact = [
        f"{call['id']}#{call['index']}"
        for call in checked
        if not bit_exact(_run(call["name"], call["arguments"]), call["expected_result"])
    ]
    exact = len(checked) - len(inexact)
    print(f"bfcl offline calls: {exact}/{len(checked)} bit-exact; not bit-exact: {inexact}")
    assert inexact == [], f"{exact}/{len(checked)} bit-exact; the others: {inexact}"


# --------------------------------------------------------------------------- get_fibonacci_number

# From the spec: F(1) = 0, F(2) = 1, n = 1..10 -> 0, 1, 1, 2, 3, 5, 8, 13, 21, 34;
# F(50) is the last element of get_fibonacci_sequence(n=50), 7778742049.
FIBONACCI = {
    1: 0,
    2: 1,
    3: 1,
    4: 2,
    5: 3,
    6: 5,
    7: 8,
    8: 13,
    9: 21,
    10: 34,
    50: 7778742049,
    100: 218922995834555169026,
}


@pytest.mark.parametrize(("n", "expected"), sorted(FIBONACCI.items()))
def test_get_fibonacci_number(n: int, expected: int) -> None:
    result = _run("get_fibonacci_number", {"n": n})
    assert type(result) is int
    assert result == expected


def test_get_fibonacci_number_is_element_n_minus_1_of_the_sequence() -> None:
    sequence = _run("get_fibonacci_sequence", {"n": 300})
    assert len(sequence) == 300
    for n in range(1, 301):
        assert _run("get_fibonacci_number", {"n": n}) == sequence[n - 1]


@pytest.mark.parametrize("n", [0, -1, -50])
def test_get_fibonacci_number_needs_a_positive_n(n: int) -> None:
    with pytest.raises(ExtensionToolError, match="n"):
        _run("get_fibonacci_number", {"n": n})


# --------------------------------------------------------------------------- spec examples

SPEC_EXAMPLES: list[tuple[str, dict[str, Any], Any]] = [
    ("add_binary_numbers", {"a": "0", "b": "0"}, "0"),
    (
        "book_room",
        {
            "room_type": "deluxe",
            "price": 1000,
            "check_in_date": "08-11-2024",
            "check_out_date": "08-15-2024",
            "customer_id": "123",
            "discount_code": "DISCOUNT10",
        },
        {
            "customer_id": "123",
            "room_number": "deluxe",
            "check_in_date": "08-11-2024",
            "check_out_date": "08-15-2024",
            "total_price": 900.0,
        },
    ),
    ("calculate_mean", {"numbers": [72, 75, 78, 80, 82, 85]}, 78.66666666666667),
    (
        "calculate_nutritional_needs",
        {
            "weight": 100,
            "height": 170,
            "age": 30,
            "gender": "male",
            "activity_level": 1,
            "goal": "lose",
        },
        {
            "calories": 1988.2984000000001,
            "proteins_g": 149.12238,
            "fats_g": 55.23051111111111,
            "carbohydrates_g": 223.68357000000003,
        },
    ),
    ("calculate_standard_deviation", {"numbers": [5]}, 0.0),
    (
        "calculate_investment_value",
        {
            "initial_investment": 10000,
            "annual_contribution": 1000,
            "years": 0,
            "annual_return": 0.05,
            "inflation_rate": [],
        },
        10000,
    ),
    (
        "calculate_investment_value",
        {
            "initial_investment": 100,
            "annual_contribution": 10,
            "years": 2,
            "annual_return": 0.5,
            "inflation_rate": [],
            "adjust_for_inflation": False,
        },
        250.0,
    ),
    ("estimate_derivative", {"function": "lambda x: 3*x**2 + 2*x + 1", "x": 5}, 32.00000264769187),
    ("estimate_derivative", {"function": "lambda x:3*x**2+2*x+1", "x": 5}, 32.00000264769187),
    ("estimate_derivative", {"function": "lambda x: 5", "x": 3}, 0.0),
    ("get_distance", {"pointA": [0, 0], "pointB": [8, 15]}, 17.0),
    ("get_fibonacci_sequence", {"n": 1}, [0]),
    ("get_fibonacci_sequence", {"n": 2}, [0, 1]),
    ("get_prime_factors", {"number": 1}, []),
    ("get_prime_factors", {"number": 1000000007}, [1000000007]),
    ("math_factorial", {"n": 0}, 1),
    ("math_factorial", {"n": 25}, 15511210043330985984000000),
    ("math_gcd", {"a": 4, "b": -6}, 2),
    ("math_gcd", {"a": 0, "b": 0}, 0),
    ("math_lcm", {"a": 0, "b": 5}, 0.0),
    ("math_lcm", {"a": -4, "b": 6}, 12.0),
    ("maxPoints", {"points": [[0, 0], [1, 1], [0, 0], [2, 2]]}, 4),
    ("maxPoints", {"points": [[3, 3]]}, 1),
    ("maxPoints", {"points": []}, 0),
    (
        "mortgage_calculator",
        {"loan_amount": 1000000, "interest_rate": 0.03, "loan_period": 10},
        9656.074469839128,
    ),
    ("order_food", {"item": [], "quantity": [], "price": []}, 0),
    ("polygon_area", {"vertices": [[-1, 0], [2, 3], [0, 4], [-2, 2]]}, 7.5),
    ("polygon_area", {"vertices": [[0, 0], [4, 0], [4, 4], [0, 4]]}, 16.0),
    (
        "quadratic_roots",
        {"a": 1, "b": 2, "c": 5},
        [{"real": -1.0, "imaginary": 2.0}, {"real": -1.0, "imaginary": -2.0}],
    ),
    ("quadratic_roots", {"a": 1, "b": -2, "c": 1}, [1.0, 1.0]),
    ("sort_array", {"array": [2, 1.0, 1, 2.0], "reverse": True}, [2, 2.0, 1.0, 1]),
]


@pytest.mark.parametrize(("name", "arguments", "expected"), SPEC_EXAMPLES)
def test_spec_example(name: str, arguments: dict[str, Any], expected: Any) -> None:
    result = _run(name, arguments)
    assert bit_exact(result, expected), f"{name}({arguments}) -> {result!r}, not {expected!r}"


def test_estimate_derivative_precedence() -> None:
    # -x**2 is -(x**2); 2**-x is 2**(-x); ** groups to the right: 2**3**x is 2**(3**x).
    value = _run("estimate_derivative", {"function": "lambda t: -t**2", "x": 1})
    assert math.isclose(value, -2.0, rel_tol=1e-4)
    value = _run("estimate_derivative", {"function": "lambda x: 2**3**x", "x": 0})
    assert math.isclose(value, 2 * math.log(2) * math.log(3), rel_tol=1e-4)
    value = _run("estimate_derivative", {"function": "lambda x: (x - 1) * 2 ** -x", "x": 1})
    assert math.isclose(value, 0.5, rel_tol=1e-4)


# --------------------------------------------------------------------------- out of domain

TOOL_ERRORS: list[tuple[str, dict[str, Any]]] = [
    ("add_binary_numbers", {"a": "", "b": "1"}),
    ("add_binary_numbers", {"a": " 0b11 ", "b": "1"}),
    ("add_binary_numbers", {"a": "12", "b": "1"}),
    ("calc_binomial_probability", {"n": 3, "k": 5, "p": 0.5}),
    ("calc_binomial_probability", {"n": 5, "k": 2, "p": 1.5}),
    ("calculate_cosine_similarity", {"vectorA": [1, 2], "vectorB": [1, 2, 3]}),
    ("calculate_cosine_similarity", {"vectorA": [0, 0], "vectorB": [1, 2]}),
    ("calculate_cosine_similarity", {"vectorA": [], "vectorB": []}),
    ("calculate_density", {"mass": 1.0, "volume": 0}),
    ("calculate_future_value", {"present_value": 100, "interest_rate": -1, "periods": -2}),
    ("calculate_future_value", {"present_value": 100.0, "interest_rate": 1e10, "periods": 100}),
    (
        "calculate_investment_value",
        {
            "initial_investment": 1,
            "annual_contribution": 1,
            "years": 3,
            "annual_return": 0.1,
            "inflation_rate": [0.1],
        },
    ),
    ("calculate_mean", {"numbers": []}),
    (
        "calculate_nutritional_needs",
        {
            "weight": 70,
            "height": 170,
            "age": 30,
            "gender": "male",
            "activity_level": 0,
            "goal": "lose",
        },
    ),
    ("calculate_permutations", {"n": 3, "k": 5}),
    ("calculate_permutations", {"n": 5, "k": -2}),
    ("calculate_permutations", {"n": 400, "k": 300}),
    ("calculate_standard_deviation", {"numbers": []}),
    ("calculate_triangle_area", {"base": -2, "height": 3}),
    ("estimate_derivative", {"function": "lambda x: 1 / x", "x": 0}),
    ("estimate_derivative", {"function": "lambda x: 0 ** (x - 1)", "x": 0}),
    ("estimate_derivative", {"function": "lambda x: (x - 1) ** 0.5", "x": 0}),
    ("estimate_derivative", {"function": "lambda x: 10.0 ** x", "x": 400}),
    ("estimate_derivative", {"function": "lambda x: 10 ** 10 ** 10 + x", "x": 1}),
    ("geometry_area_circle", {"radius": -1}),
    ("get_distance", {"pointA": [0, 0, 5], "pointB": [3, 4, 9]}),
    ("get_distance", {"pointA": [0], "pointB": [3, 4]}),
    ("get_fibonacci_sequence", {"n": 0}),
    ("get_prime_factors", {"number": 0}),
    ("get_prime_factors", {"number": -12}),
    ("linear_regression", {"x": [1, 1, 1], "y": [1, 2, 3], "point": 2}),
    ("linear_regression", {"x": [1, 2, 3], "y": [1, 2], "point": 2}),
    ("linear_regression", {"x": [1], "y": [1], "point": 2}),
    (
        "mat_mul",
        {
            "matA": [[27, 28, 29, 30], [31, 32, 33, 34]],
            "matB": [[35, 36, 37, 38], [39, 40, 41, 42]],
        },
    ),
    ("mat_mul", {"matA": [], "matB": [[1]]}),
    ("mat_mul", {"matA": [[1, 2], [3]], "matB": [[1], [2]]}),
    ("math_factorial", {"n": -1}),
    ("math_lcm", {"a": 0, "b": 0}),
    ("maxPoints", {"points": [[1, 2, 3], [4, 5, 6]]}),
    ("mortgage_calculator", {"loan_amount": 1000, "interest_rate": 0, "loan_period": 10}),
    ("mortgage_calculator", {"loan_amount": 1000, "interest_rate": 0.05, "loan_period": 0}),
    ("order_food", {"item": ["a", "b"], "quantity": [1], "price": [1.0, 2.0]}),
    ("polygon_area", {"vertices": [[1, 2], [3, 4]]}),
    ("polygon_area", {"vertices": [[1, 2], [3, 4], [1, 4], [3, 7]]}),
    ("polygon_area", {"vertices": [[0, 0], [2, 0], [1, 0], [1, 1]]}),
    ("polygon_area", {"vertices": [[0, 0], [4, 0], [4, 4], [0, 4], [2, 0]]}),
    ("polygon_area", {"vertices": [[0, 0, 1], [4, 0, 1], [4, 4, 1]]}),
    ("quadratic_roots", {"a": 0, "b": 2, "c": 1}),
]


@pytest.mark.parametrize(("name", "arguments"), TOOL_ERRORS)
def test_out_of_domain_is_a_tool_error(name: str, arguments: dict[str, Any]) -> None:
    """Arguments the schema takes but the function refuses reach the model as tool_error."""
    result = run_tool(extension, name, arguments)
    assert result.status is Status.TOOL_ERROR, result
    assert set(result.content) == {"error"} and result.content["error"]


def test_polygon_area_does_not_modify_its_input() -> None:
    parsed = PolygonAreaArguments.model_validate({"vertices": [[1, 2], [3, 4], [1, 3]]})
    assert PolygonArea().call(parsed, _context("ext_bfcl_polygon_area")) == 1.0
    assert parsed.vertices == [[1, 2], [3, 4], [1, 3]]


# --------------------------------------------------------------------------- invalid arguments

INVALID_ARGUMENTS: list[tuple[str, dict[str, Any] | str]] = [
    ("estimate_derivative", {"function": "__import__('os').system('id')", "x": 1}),
    ("estimate_derivative", {"function": "lambda x: __import__('os').system('id')", "x": 1}),
    ("estimate_derivative", {"function": "lambda x: x.real", "x": 1}),
    ("estimate_derivative", {"function": "lambda x: abs(x)", "x": 1}),
    ("estimate_derivative", {"function": "lambda x: y", "x": 1}),
    ("estimate_derivative", {"function": "lambda x, y: x", "x": 1}),
    ("estimate_derivative", {"function": "lambda x: x[0]", "x": 1}),
    ("estimate_derivative", {"function": "lambda x: x // 2", "x": 1}),
    ("estimate_derivative", {"function": "lambda x: 2x", "x": 1}),
    ("estimate_derivative", {"function": "lambda x: 05 * x", "x": 1}),
    ("estimate_derivative", {"function": "lambda x: (x", "x": 1}),
    ("estimate_derivative", {"function": "lambda: 1", "x": 1}),
    ("estimate_derivative", {"function": "3*x**2", "x": 1}),
    ("estimate_derivative", {"function": "lambda x: " + "(" * 200 + "x" + ")" * 200, "x": 1}),
    ("estimate_derivative", {"function": "lambda x: " + "-" * 500 + "x", "x": 1}),
    ("math_factorial", {"n": 1.5}),
    ("math_factorial", {"n": True}),
    ("math_factorial", {}),
    ("math_factorial", {"n": 3, "extra": 1}),
    (
        "book_room",
        {
            "room_type": "deluxe",
            "check_in_date": "08-11-2024",
            "check_out_date": "08-15-2024",
            "customer_id": "123",
        },
    ),
    ("calculate_density", '{"mass": NaN, "volume": 1.0}'),  # as a model would write it
    ("mat_mul", {"matA": [1, 2], "matB": [3, 4]}),
    ("sort_array", {"array": [1, "a"]}),
    ("math_factorial", {"n": 1_000_000}),
    ("get_fibonacci_number", {"n": 10**9}),
    ("get_fibonacci_sequence", {"n": 10**6}),
    ("get_prime_factors", {"number": 10**12 + 39}),
    (
        "calculate_nutritional_needs",
        {"weight": 70, "height": 170, "age": 30, "gender": "robot", "activity_level": 3,
         "goal": "lose"},
    ),
    (
        "calculate_nutritional_needs",
        {"weight": 70, "height": 170, "age": 30, "gender": "male", "activity_level": 3,
         "goal": "bulk"},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("name", "arguments"), INVALID_ARGUMENTS)
def test_schema_violations_are_invalid_arguments(
    name: str, arguments: dict[str, Any] | str
) -> None:
    """Arguments the schema refuses are invalid_arguments before the function runs."""
    result = run_tool(extension, name, arguments)
    assert result.status is Status.INVALID_ARGUMENTS, result


def test_enumerated_strings_are_declared_and_matched_to_their_canonical_value() -> None:
    """gender and goal are schema enums; "Male" / " LOSE " mean "male" / "lose"."""
    tool = TOOLS_BY_NAME["calculate_nutritional_needs"]
    assert tool.arguments_model is not None
    properties = tool.parameters()["properties"]
    assert properties["gender"]["enum"] == ["male", "female", "other"]
    assert properties["goal"]["enum"] == ["lose", "gain", "maintain"]
    body = {"weight": 70, "height": 170, "age": 30, "activity_level": 3}
    canonical = _run("calculate_nutritional_needs", {**body, "gender": "male", "goal": "lose"})
    assert canonical == _run(
        "calculate_nutritional_needs", {**body, "gender": "Male", "goal": " LOSE "}
    )
    with pytest.raises(ValidationError, match="'male', 'female' or 'other'"):
        tool.arguments_model.model_validate({**body, "gender": "robot", "goal": "lose"})


def test_cpu_heavy_arguments_are_bounded_in_the_schema() -> None:
    """The largest accepted arguments are schema maxima the model reads, and each runs fast."""
    bounds = {
        "math_factorial": ("n", 10_000),
        "get_prime_factors": ("number", 10**12),
        "get_fibonacci_number": ("n", 100_000),
        "get_fibonacci_sequence": ("n", 2_000),
    }
    for name, (argument, bound) in bounds.items():
        assert TOOLS_BY_NAME[name].parameters()["properties"][argument]["maximum"] == bound
        assert _run(name, {argument: bound}) is not None
    with pytest.raises(ExtensionToolError, match="float range"):
        _run("calculate_permutations", {"n": 10**9, "k": 10**6})
    with pytest.raises(ExtensionToolError, match="float range"):
        _run("calc_binomial_probability", {"n": 10**9, "k": 5 * 10**8, "p": 0.5})


def test_every_builtin_function_is_idempotent() -> None:
    """The BFCL functions are pure: all are declared idempotent, so a crash re-runs them."""
    from toolfleet.worker.registry.registry import Registry

    registry = Registry()
    registry.add_extension(extension)
    assert len(registry.served) == 32
    assert all(served.idempotent for served in registry.served.values())


def test_numbers_keep_their_json_type() -> None:
    assert (
        _run("calculate_final_velocity", {"initial_velocity": 5, "acceleration": 2, "time": 10})
        == 25
    )
    result = _run("calculate_electrostatic_potential_energy", {"charge": 0, "voltage": 2000})
    assert type(result) is int
    result = _run("calculate_electrostatic_potential_energy", {"charge": 0.0, "voltage": 2000})
    assert type(result) is float
    big = 10**30
    assert _run("order_food", {"item": ["x"], "quantity": [big], "price": [big]}) == big * big
