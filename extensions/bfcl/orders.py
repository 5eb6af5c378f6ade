"""Booking and ordering tools: hotel room booking and food orders."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.extensions.bfcl._common import Integer, Number, arithmetic_guard, ensure_finite
from toolfleet.shared import ExtensionContext, ExtensionToolError, Tool

__all__ = [
    "DISCOUNT_CODE",
    "DISCOUNT_FACTOR",
    "BookRoom",
    "BookRoomArguments",
    "OrderFood",
    "OrderFoodArguments",
]

DISCOUNT_CODE = "DISCOUNT10"
"""The one discount code ``book_room`` knows (case-sensitive)."""

DISCOUNT_FACTOR = 0.9
"""What the price is multiplied by when :data:`DISCOUNT_CODE` is given."""


class BookRoomArguments(BaseModel):
    """Arguments of book_room."""

    model_config = ConfigDict(extra="forbid")

    room_type: str = Field(description="The room type to book.")
    price: Number = Field(description="The price of the room.")
    check_in_date: str = Field(description="The check-in date in format of MM-DD-YYYY.")
    check_out_date: str = Field(description="The check-out date in format of MM-DD-YYYY.")
    customer_id: str = Field(description="The customer ID.")
    discount_code: str | None = Field(default=None, description="The discount code (if any).")


class BookRoom(Tool):
    """Book a room for a customer and return the booking.

    The booking echoes the customer, the room type (under "room_number") and the dates,
    with the total price; the code DISCOUNT10 takes 10% off.
    """

    name = "book_room"
    arguments_model = BookRoomArguments

    def call(self, arguments: BookRoomArguments, context: ExtensionContext) -> dict[str, Any]:
        """Return the booking object."""
        total: int | float = arguments.price
        if arguments.discount_code == DISCOUNT_CODE:
            message = "price is too large for a float computation"
            with arithmetic_guard(message):
                total = ensure_finite(total * DISCOUNT_FACTOR, message)
        return {
            "customer_id": arguments.customer_id,
            "room_number": arguments.room_type,
            "check_in_date": arguments.check_in_date,
            "check_out_date": arguments.check_out_date,
            "total_price": total,
        }


class OrderFoodArguments(BaseModel):
    """Arguments of order_food."""

    model_config = ConfigDict(extra="forbid")

    item: list[str] = Field(description="The names of the products ordered.")
    quantity: list[Integer] = Field(
        description="The number of each product purchased, in the order of item."
    )
    price: list[Number] = Field(description="The unit price of each product, in the order of item.")


class OrderFood(Tool):
    """Order food for a customer and return the total price: sum of quantity * price.

    item, quantity and price are parallel lists of the same length.
    """

    name = "order_food"
    arguments_model = OrderFoodArguments

    def call(self, arguments: OrderFoodArguments, context: ExtensionContext) -> int | float:
        """Return the sum of ``quantity[i] * price[i]`` in list order."""
        items, quantities, prices = arguments.item, arguments.quantity, arguments.price
        if not len(items) == len(quantities) == len(prices):
            raise ExtensionToolError(
                "item, quantity and price must have the same length, got "
                f"{len(items)}, {len(quantities)} and {len(prices)}"
            )
        message = "quantity and price are too large: the total exceeds the float range"
        total: int | float = 0
        with arithmetic_guard(message):
            for index in range(len(items)):
                total = total + (quantities[index] * prices[index])
        return ensure_finite(total, message)
