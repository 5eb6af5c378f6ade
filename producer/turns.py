"""The tool calls of one model turn, read from and answered in the model API's own format.

Three families of message formats are read (plain dicts, or the SDK objects of the
``openai`` and ``anthropic`` packages, read by attribute; neither package is imported):

``openai-chat``
    OpenAI Chat Completions (API reference "Chat Completions > Create", guide
    "Function calling"): a completion (its first choice is used), an assistant message
    (``{"role": "assistant", "tool_calls": [...]}``) or its ``tool_calls`` list, each
    ``{"id", "type": "function", "function": {"name", "arguments"}}`` with
    ``arguments`` the model's JSON string. Answered with one tool message per call:
    ``{"role": "tool", "tool_call_id": id, "content": "<JSON text>"}``.
``openai-responses``
    OpenAI Responses (API reference "Responses > Create", guide "Function calling"): a
    response, or a list of its ``output`` items; ``{"type": "function_call", "call_id",
    "name", "arguments"}`` items are the calls, other items (``message``,
    ``reasoning``...) are skipped. Answered with ``{"type": "function_call_output",
    "call_id": call_id, "output": "<JSON text>"}`` input items.
``anthropic``
    Anthropic Messages (docs "Tool use with Claude", "Handle tool calls"): an assistant
    message or its ``content`` blocks; ``{"type": "tool_use", "id", "name", "input"}``
    blocks are the calls, other blocks (``text``, ``thinking``...) are skipped.
    Answered with ``{"type": "tool_result", "tool_use_id": id, "content": "<JSON text>",
    "is_error": bool}`` blocks (``is_error`` true for every status but ``ok``), which go,
    in order and before any text, into the ``content`` of the next ``user`` message.

The content of every answer is the result's JSON value as JSON text: the tool's value,
or ``{"error": "<message>"}``. Every call gets exactly one answer, in the call's position:

- A call that cannot be run as given (no function name, no id, a ``custom`` tool call,
  arguments that are not JSON) is still a call of the turn: it is kept, with
  :attr:`TurnCall.problem` saying why, and answered ``rejected``.
- **Duplicate ids.** A model API pairs each answer with its call by id, and refuses a
  request that answers one id twice. So inside one turn the first call with a
  ``tool_call_id`` runs, and each later call with the same id
  (:attr:`TurnCall.duplicate_of`) is answered ``rejected`` ("duplicate tool_call id")
  without being published: its ``result`` event carries that result and no message, and
  the messages of the turn hold one answer per id, the first call's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from toolfleet.shared import codec
from toolfleet.shared.errors import ClientError
from toolfleet.shared.wire import ToolCallResult

__all__ = [
    "Family",
    "Turn",
    "TurnCall",
    "duplicate_message",
    "parse_tool_calls",
    "result_content",
    "result_message",
]

#: The message formats a turn can be read from and answered in.
Family = Literal["openai-chat", "openai-responses", "anthropic"]

_CHAT: Family = "openai-chat"
_RESPONSES: Family = "openai-responses"
_ANTHROPIC: Family = "anthropic"
_SKIP = "skip"


@dataclass(frozen=True, slots=True)
class TurnCall:
    """One tool call of a turn, in a common shape.

    Attributes:
        index: position among the turn's calls (0-based; skipped items not counted).
        tool_call_id: the model's id (``id``, or ``call_id`` for Responses); ``""``
            when the model gave none.
        function: the function name (``""`` when the call names none).
        arguments: a JSON object, the model's raw JSON string, or ``None``.
        problem: why the call cannot be run (``""`` when it can).
        duplicate_of: the index of the turn's earlier call with the same
            ``tool_call_id`` (this call is answered ``rejected`` and has no message), or
            ``None``.
    """

    index: int
    tool_call_id: str
    function: str
    arguments: dict[str, Any] | str | None
    problem: str = ""
    duplicate_of: int | None = None


@dataclass(frozen=True, slots=True)
class Turn:
    """The tool calls of one model turn and the format to answer them in.

    Attributes:
        family: ``openai-chat``, ``openai-responses`` or ``anthropic``.
        calls: the calls, in the model's order.
    """

    family: Family
    calls: tuple[TurnCall, ...]


def parse_tool_calls(tool_calls: Any) -> Turn:
    """Read the tool calls of one model turn (see the module docstring for the formats).

    Args:
        tool_calls: a Chat Completions completion, assistant message or ``tool_calls``
            list; a Responses response or ``output`` item list; an Anthropic assistant
            message or ``content`` block list. Dicts or SDK objects.

    Returns:
        The :class:`Turn`; no calls when the message has none.

    Raises:
        ClientError: not one of these formats, or items of several formats mixed.
    """
    if isinstance(tool_calls, (str, bytes)):
        raise ClientError("tool_calls must be a message, a response or a list of tool calls")
    if _has(tool_calls, "choices"):
        choices = _get(tool_calls, "choices")
        if not isinstance(choices, Sequence) or not choices:
            raise ClientError("the chat completion has no choices")
        return parse_tool_calls(_get(choices[0], "message"))
    if _has(tool_calls, "tool_calls"):
        items = _get(tool_calls, "tool_calls") or []
        return Turn(_CHAT, tuple(_calls(_as_list(items), _CHAT)))
    for attribute in ("output", "content"):
        if _has(tool_calls, attribute) and not isinstance(tool_calls, Sequence):
            value = _get(tool_calls, attribute)
            if isinstance(value, str) or value is None:  # a chat message without tool calls
                return Turn(_CHAT, ())
            return parse_tool_calls(_as_list(value))
    if not isinstance(tool_calls, Sequence):
        raise ClientError(
            "tool_calls must be a chat completion, a message with tool_calls or content, "
            f"a response, or a list of tool calls; got {type(tool_calls).__name__}"
        )
    kinds = [_kind(item) for item in tool_calls]
    families = {k for k in kinds if k not in (None, _SKIP)}
    if len(families) > 1:
        raise ClientError(f"tool calls of several formats in one turn: {sorted(families)}")
    if not families:
        if any(k is None for k in kinds):
            raise ClientError("cannot tell the tool calls' format (no item has a known type)")
        return Turn(_CHAT, ())
    family: Family = families.pop()  # type: ignore[assignment]
    if family != _CHAT:
        unknown = [i for i, k in enumerate(tool_calls) if k is None]
        if unknown:
            raise ClientError(f"item {unknown[0]} of the {family} turn has no type")
        tool_calls = [item for item, k in zip(tool_calls, kinds, strict=True) if k == family]
    return Turn(family, tuple(_calls(list(tool_calls), family)))


def result_content(result: ToolCallResult) -> str:
    """The result's JSON value as JSON text (exact big integers, never raises)."""
    try:
        return codec.dumps_str(result.content)
    except codec.EncodeError:  # pragma: no cover - results come decoded from JSON
        return codec.dumps_str({"error": "the result could not be encoded"})


def result_message(family: Family, call: TurnCall, result: ToolCallResult) -> dict[str, Any]:
    """The ready-to-append answer to ``call`` in ``family``'s format.

    Args:
        family: the turn's format.
        call: the call answered.
        result: its terminal result.

    Returns:
        ``{"role": "tool", "tool_call_id", "content"}`` (openai-chat),
        ``{"type": "function_call_output", "call_id", "output"}`` (openai-responses) or
        ``{"type": "tool_result", "tool_use_id", "content", "is_error"}`` (anthropic);
        the content is JSON text.
    """
    content = result_content(result)
    if family == _RESPONSES:
        return {"type": "function_call_output", "call_id": call.tool_call_id, "output": content}
    if family == _ANTHROPIC:
        return {
            "type": "tool_result",
            "tool_use_id": call.tool_call_id,
            "content": content,
            "is_error": not result.ok,
        }
    return {"role": "tool", "tool_call_id": call.tool_call_id, "content": content}


def _calls(items: list[Any], family: Family) -> list[TurnCall]:
    calls = []
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        call = _call(index, item, family)
        if call.tool_call_id:
            earlier = first.setdefault(call.tool_call_id, index)
            if earlier != index:
                call = replace(call, duplicate_of=earlier)
        calls.append(call)
    return calls


def duplicate_message(call: TurnCall) -> str:
    """The error text a duplicate call is answered with (``call.duplicate_of`` is set)."""
    return (
        f"duplicate tool_call id {call.tool_call_id!r}: call {call.duplicate_of} of the turn "
        f"has that id and is the one that runs; give each tool call its own id"
    )


def _call(index: int, item: Any, family: Family) -> TurnCall:
    problems: list[str] = []
    if family == _CHAT:
        call_id = _get(item, "id")
        kind = _get(item, "type")
        function = _get(item, "function")
        if kind not in (None, "function") or function is None:
            custom = _get(item, "custom")
            name = _get(custom, "name") if custom is not None else None
            problems.append(
                f"a {kind or 'malformed'} tool call: only function tools run on the fleet"
            )
            arguments: Any = None
        else:
            name, arguments = _get(function, "name"), _get(function, "arguments")
    elif family == _RESPONSES:
        call_id = _get(item, "call_id")
        name, arguments = _get(item, "name"), _get(item, "arguments")
    else:
        call_id = _get(item, "id")
        name, arguments = _get(item, "name"), _get(item, "input")
    if not isinstance(call_id, str) or not call_id:
        problems.append("the tool call has no id")
    if not isinstance(name, str) or not name:
        problems.append("the tool call names no function")
    arguments, arguments_problem = _arguments(arguments)
    if arguments_problem:
        problems.append(arguments_problem)
    return TurnCall(
        index=index,
        tool_call_id=call_id if isinstance(call_id, str) else "",
        function=name if isinstance(name, str) else "",
        arguments=arguments,
        problem="; ".join(problems),
    )


def _arguments(value: Any) -> tuple[dict[str, Any] | str | None, str]:
    """Arguments as published: an object, the raw string, or other JSON as JSON text.

    JSON that is not an object (a list, a number) travels as text so that the worker
    answers ``invalid_arguments`` the way it does for any other bad arguments.
    """
    if value is None or isinstance(value, str):
        return value, ""
    if isinstance(value, Mapping):
        return dict(value), ""
    try:
        return codec.dumps_str(value), ""
    except codec.EncodeError as exc:
        return None, f"the arguments are not JSON: {exc}"


def _kind(item: Any) -> str | None:
    """The family an item belongs to, ``"skip"`` for non-call items, ``None`` if unknown."""
    kind = _get(item, "type")
    if kind == "function_call":
        return _RESPONSES
    if kind == "tool_use":
        return _ANTHROPIC
    if kind in ("function", "custom") or _get(item, "function") is not None:
        return _CHAT
    return _SKIP if isinstance(kind, str) else None


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ClientError(f"expected a list of tool calls, got {type(value).__name__}")
    return list(value)


def _has(obj: Any, name: str) -> bool:
    if isinstance(obj, Mapping):
        return name in obj
    if isinstance(obj, (Sequence, str, bytes)) or obj is None:
        return False
    return hasattr(obj, name)


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)
