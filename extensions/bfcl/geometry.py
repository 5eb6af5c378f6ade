"""Plane geometry tools: triangle and circle areas, distance, polygon area, collinear points."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.extensions.bfcl._common import Integer, Number, arithmetic_guard, ensure_finite
from toolfleet.shared import ExtensionContext, ExtensionToolError, Tool

__all__ = [
    "CalculateTriangleArea",
    "CalculateTriangleAreaArguments",
    "GeometryAreaCircle",
    "GeometryAreaCircleArguments",
    "GetDistance",
    "GetDistanceArguments",
    "MaxPoints",
    "MaxPointsArguments",
    "PolygonArea",
    "PolygonAreaArguments",
    "is_simple_polygon",
]

_Exact = int | Fraction
_Point = tuple[_Exact, _Exact]


def _require_pairs(label: str, points: Sequence[Sequence[int | float]]) -> None:
    """Raise a tool error unless every point has exactly two coordinates."""
    for index, point in enumerate(points):
        if len(point) != 2:
            raise ExtensionToolError(
                f"{label}[{index}] must have exactly 2 coordinates [x, y], got {len(point)}"
            )


class CalculateTriangleAreaArguments(BaseModel):
    """Arguments of calculate_triangle_area."""

    model_config = ConfigDict(extra="forbid")

    base: Integer = Field(description="The base of the triangle, in meters.")
    height: Integer = Field(description="The height of the triangle, in meters.")


class CalculateTriangleArea(Tool):
    """Calculate the area of a triangle from its base and height: base * height / 2."""

    name = "calculate_triangle_area"
    arguments_model = CalculateTriangleAreaArguments

    def call(self, arguments: CalculateTriangleAreaArguments, context: ExtensionContext) -> float:
        """Return ``(base * height) / 2`` as a float."""
        for label, size in (("base", arguments.base), ("height", arguments.height)):
            if size < 0:
                raise ExtensionToolError(f"{label} must be >= 0, got {size}")
        with arithmetic_guard("base and height are too large: the area exceeds the float range"):
            return (arguments.base * arguments.height) / 2


class GeometryAreaCircleArguments(BaseModel):
    """Arguments of geometry_area_circle."""

    model_config = ConfigDict(extra="forbid")

    radius: Integer = Field(description="The radius of the circle, in feet.")


class GeometryAreaCircle(Tool):
    """Calculate the area of a circle from its radius: pi * radius**2."""

    name = "geometry_area_circle"
    arguments_model = GeometryAreaCircleArguments

    def call(self, arguments: GeometryAreaCircleArguments, context: ExtensionContext) -> float:
        """Return ``pi * radius**2`` as a float."""
        radius = arguments.radius
        if radius < 0:
            raise ExtensionToolError(f"radius must be >= 0, got {radius}")
        message = "radius is too large: the area exceeds the float range"
        with arithmetic_guard(message):
            area = math.pi * (radius**2)
        return float(ensure_finite(area, message))


class GetDistanceArguments(BaseModel):
    """Arguments of get_distance."""

    model_config = ConfigDict(extra="forbid")

    pointA: list[Number] = Field(description="The first point, as [x, y].")
    pointB: list[Number] = Field(description="The second point, as [x, y].")


class GetDistance(Tool):
    """Calculate the Euclidean distance between two 2D points given as [x, y]."""

    name = "get_distance"
    arguments_model = GetDistanceArguments

    def call(self, arguments: GetDistanceArguments, context: ExtensionContext) -> float:
        """Return ``((xA - xB)**2 + (yA - yB)**2) ** 0.5``."""
        point_a, point_b = arguments.pointA, arguments.pointB
        for label, point in (("pointA", point_a), ("pointB", point_b)):
            if len(point) != 2:
                raise ExtensionToolError(
                    f"{label} must have exactly 2 coordinates [x, y], got {len(point)}"
                )
        message = "the points are too far apart: the distance exceeds the float range"
        with arithmetic_guard(message):
            distance = (((point_a[0] - point_b[0]) ** 2) + ((point_a[1] - point_b[1]) ** 2)) ** 0.5
        return float(ensure_finite(distance, message))


def _exact(value: int | float) -> _Exact:
    """The exact rational value of a JSON number."""
    return Fraction(value) if isinstance(value, float) else value


def _orientation(p: _Point, q: _Point, r: _Point) -> int:
    """Sign of the turn p -> q -> r: 1 counter-clockwise, -1 clockwise, 0 collinear."""
    cross = (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])
    return (cross > 0) - (cross < 0)


def _within_box(p: _Point, q: _Point, r: _Point) -> bool:
    """Whether r lies in the bounding box of segment p-q (r is known to be collinear)."""
    return min(p[0], q[0]) <= r[0] <= max(p[0], q[0]) and min(p[1], q[1]) <= r[1] <= max(p[1], q[1])


def _segments_meet(p1: _Point, p2: _Point, p3: _Point, p4: _Point) -> bool:
    """Whether the closed segments p1-p2 and p3-p4 share at least one point."""
    d1 = _orientation(p3, p4, p1)
    d2 = _orientation(p3, p4, p2)
    d3 = _orientation(p1, p2, p3)
    d4 = _orientation(p1, p2, p4)
    if d1 * d2 < 0 and d3 * d4 < 0:
        return True
    return (
        (d1 == 0 and _within_box(p3, p4, p1))
        or (d2 == 0 and _within_box(p3, p4, p2))
        or (d3 == 0 and _within_box(p1, p2, p3))
        or (d4 == 0 and _within_box(p1, p2, p4))
    )


def is_simple_polygon(vertices: Sequence[Sequence[int | float]]) -> bool:
    """Whether no two non-adjacent edges of the closed polygon share a point.

    Edge ``i`` joins vertex ``i`` to vertex ``i + 1`` (the last one wraps to vertex 0);
    two edges are adjacent when they share a vertex index. Crossing, touching and
    collinear overlap all count, tested exactly on rational values.

    Args:
        vertices: at least 3 points ``[x, y]``.

    Returns:
        True when the vertex order describes a simple polygon.
    """
    points: list[_Point] = [(_exact(x), _exact(y)) for x, y in vertices]
    count = len(points)
    edges = [(points[i], points[(i + 1) % count]) for i in range(count)]
    for i in range(count):
        for j in range(i + 2, count):
            if i == 0 and j == count - 1:
                continue  # the closing edge is adjacent to edge 0
            if _segments_meet(*edges[i], *edges[j]):
                return False
    return True


class PolygonAreaArguments(BaseModel):
    """Arguments of polygon_area."""

    model_config = ConfigDict(extra="forbid")

    vertices: list[list[Number]] = Field(
        description=(
            "The vertices of the polygon in order, where each vertex is a 2 element list [x, y]."
        )
    )


class PolygonArea(Tool):
    """Calculate the area of a simple polygon from its vertices with the shoelace formula.

    The vertices are given in order around the polygon (at least 3, each [x, y]); a
    self-intersecting order is refused.
    """

    name = "polygon_area"
    arguments_model = PolygonAreaArguments

    def call(self, arguments: PolygonAreaArguments, context: ExtensionContext) -> float:
        """Return ``|sum(x_i * y_(i+1) - x_(i+1) * y_i)| / 2`` as a float."""
        vertices = arguments.vertices
        if len(vertices) < 3:
            raise ExtensionToolError(f"vertices must hold at least 3 points, got {len(vertices)}")
        _require_pairs("vertices", vertices)
        if not is_simple_polygon(vertices):
            raise ExtensionToolError(
                "vertices do not describe a simple polygon: two non-adjacent edges "
                "cross or touch (check the vertex order)"
            )
        message = "vertices are too large: the area exceeds the float range"
        count = len(vertices)
        with arithmetic_guard(message):
            total: int | float = 0
            for i in range(count):
                x0, y0 = vertices[i]
                x1, y1 = vertices[(i + 1) % count]
                total = total + ((x0 * y1) - (x1 * y0))
            area = abs(total) / 2.0
        return float(ensure_finite(area, message))


class MaxPointsArguments(BaseModel):
    """Arguments of maxPoints."""

    model_config = ConfigDict(extra="forbid")

    points: list[list[Integer]] = Field(
        description="The list of points; each point is a 2 element list [x, y] of integers."
    )


class MaxPoints(Tool):
    """Find the maximum number of the given points that lie on one straight line.

    Each list element counts once, so repeated points all count on any line through
    their position.
    """

    name = "maxPoints"
    arguments_model = MaxPointsArguments

    def call(self, arguments: MaxPointsArguments, context: ExtensionContext) -> int:
        """Return the largest number of collinear points, counted exactly."""
        points = arguments.points
        _require_pairs("points", points)
        count = len(points)
        if count <= 2:
            return count
        best = 0
        for i, (xi, yi) in enumerate(points):
            same = 1
            directions: Counter[tuple[int, int]] = Counter()
            for xj, yj in points[i + 1 :]:
                dx, dy = xj - xi, yj - yi
                if dx == 0 and dy == 0:
                    same += 1
                    continue
                divisor = math.gcd(dx, dy)
                dx, dy = dx // divisor, dy // divisor
                if dx < 0 or (dx == 0 and dy < 0):
                    dx, dy = -dx, -dy
                directions[(dx, dy)] += 1
            best = max(best, same + max(directions.values(), default=0))
        return best
