"""How a route of the API port is declared: its method and path, its parameters with their limits and defaults,
its responses. The router binds each handler to its declaration and reads every parameter through it, and the
OpenAPI document renders the same declarations, so neither can state a limit the other does not apply.
tailwatch/routes.py holds the table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, Protocol

from aiohttp import web

from storage.ports import QueryError
from tailwatch.error_body import error

Json = dict[str, Any]
# Which part of the service a route belongs to: the SQL routes exist only with an analyst store, the console's
# only with its reads.
Group = Literal["core", "sql", "console"]
Handler = Callable[[web.Request, "Args"], Awaitable[web.StreamResponse]]

TIME: Json = {"type": "string", "format": "date-time", "description": "ISO 8601 in UTC, with `Z`."}
NOW: Final = "now"


def instant(text: str, name: str) -> datetime:
    """An ISO 8601 instant as naive UTC, like the stored columns; a QueryError says what was wrong."""
    if not text:
        raise QueryError("bad_request", f"{name} is required (ISO 8601, e.g. 2026-11-20T00:00:00Z)")
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise QueryError("bad_request", f"{name} must be ISO 8601 (got {text!r})") from None
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value


def ref(schema: str) -> Json:
    return {"$ref": f"#/components/schemas/{schema}"}


def answer(schema: Json, description: str, **extra: Any) -> Json:
    """A JSON response."""
    return {"description": description, "content": {"application/json": {"schema": schema}}, **extra}


def refusal(description: str, **extra: Any) -> Json:
    """An error response: the one error body, with what the status means here."""
    return answer(ref("Error"), description, **extra)


def groups(*, sql: bool, console: bool) -> frozenset[Group]:
    """The groups a port serves, with or without its SQL routes and its console."""
    chosen: set[Group] = {"core"}
    if sql:
        chosen.add("sql")
    if console:
        chosen.add("console")
    return frozenset(chosen)


class BadParameter(QueryError):
    """A parameter its declaration refuses: a 400 naming it, whichever handler asked."""

    def __init__(self, message: str) -> None:
        super().__init__("bad_request", message)


class Param(Protocol):
    @property
    def name(self) -> str: ...

    def spec(self) -> Json:
        """The OpenAPI parameter object."""
        ...

    def read(self, args: Args) -> Any:
        """The value the handler gets; raises QueryError when the request's value breaks the declaration."""
        ...


def _query(name: str, schema: Json, description: str, required: bool) -> Json:
    return {"name": name, "in": "query", "required": required, "description": description, "schema": schema}


@dataclass(frozen=True)
class PathPart:
    name: str

    def spec(self) -> Json:
        return {"name": self.name, "in": "path", "required": True, "schema": {"type": "string"}}

    def read(self, args: Args) -> str:
        return args.request.match_info[self.name]


@dataclass(frozen=True)
class Text:
    """A string; None when absent. `enum` documents the values whoever consumes it accepts."""

    name: str
    description: str
    enum: tuple[str, ...] = ()
    required: bool = False

    def spec(self) -> Json:
        schema: Json = {"type": "string", **({"enum": list(self.enum)} if self.enum else {})}
        return _query(self.name, schema, self.description, self.required)

    def read(self, args: Args) -> str | None:
        return args.request.query.get(self.name)


@dataclass(frozen=True)
class Before:
    """A default instant: `span` before the value of the parameter `other`."""

    other: str
    span: timedelta

    def __str__(self) -> str:
        hours, rest = divmod(self.span, timedelta(hours=1))
        return f"{hours} hours before `{self.other}`" if not rest else f"{self.span} before `{self.other}`"


@dataclass(frozen=True)
class Instant:
    """An ISO 8601 instant, as naive UTC. Absent, it is its default: none, now, or a span before another."""

    name: str
    description: str
    required: bool = False
    default: Literal["now"] | Before | None = None

    def spec(self) -> Json:
        said = f"{self.description}; default {self.default}." if self.default else self.description
        return _query(self.name, TIME, said, self.required)

    def read(self, args: Args) -> datetime | None:
        query = args.request.query
        if self.name in query or self.required:
            return instant(query.get(self.name, ""), self.name)
        if self.default == NOW:
            return datetime.now(UTC).replace(tzinfo=None)
        if isinstance(self.default, Before):
            other: datetime = args[self.default.other]
            return other - self.default.span
        return None


@dataclass(frozen=True)
class RowLimit:
    """`limit`: a whole number of rows, `default` when absent; more than `cap` is taken as `cap`."""

    default: int
    cap: int
    name: str = "limit"

    def spec(self) -> Json:
        said = (
            f"At most {self.cap:,} rows."
            if self.default == self.cap
            else f"Rows to return; more than {self.cap:,} is taken as {self.cap:,}."
        )
        return _query(self.name, {"type": "integer", "minimum": 0, "default": self.default}, said, False)

    def read(self, args: Args) -> int:
        text = args.request.query.get(self.name, str(self.default))
        # ASCII digits only: int() would take a sign, spaces, underscores and other scripts' digits.
        if not (text.isascii() and text.isdigit()):
            raise QueryError("bad_request", f"{self.name} must be a whole number, 0 or more (got {text!r})")
        return min(int(text), self.cap)


@dataclass(frozen=True)
class Flag:
    name: str
    description: str
    default: bool = False

    def spec(self) -> Json:
        return _query(self.name, {"type": "boolean", "default": self.default}, self.description, False)

    def read(self, args: Args) -> bool:
        return args.request.query.get(self.name, str(self.default)).lower() in ("true", "1", "yes")


@dataclass(frozen=True)
class Route:
    method: Literal["GET", "POST"]
    path: str
    operation_id: str
    summary: str
    responses: Mapping[str, Json]
    group: Group = "core"
    params: tuple[Param, ...] = ()
    description: str | None = None
    body: Json | None = None
    # Answers without the token: probes, and the description a client reads before it has one.
    open: bool = False
    # What it answers without the token when that is not the common 401 (the console's sign-in page).
    unauthorized: Json | None = None

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"{self.method} {self.path} declares no parameter {name!r}")

    def operation(self) -> Json:
        """The OpenAPI operation object; a fresh one each time, since a document adds its auth to it."""
        op: Json = {"operationId": self.operation_id, "summary": self.summary}
        if self.description is not None:
            op["description"] = self.description
        if self.params:
            op["parameters"] = [p.spec() for p in self.params]
        if self.body is not None:
            op["requestBody"] = self.body
        op["responses"] = dict(self.responses)
        return op


class Args:
    """A request's parameters, each read through its route's declaration when the handler asks for it, so a
    handler checks them in its own order."""

    def __init__(self, route: Route, request: web.Request) -> None:
        self.route = route
        self.request = request
        # Read once: a default of "now" must be one instant for every parameter that derives from it.
        self._values: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._values:
            try:
                self._values[name] = self.route.param(name).read(self)
            except QueryError as exc:
                raise BadParameter(exc.message) from None
        return self._values[name]

    def undeclared(self) -> dict[str, str]:
        """The query parameters the route does not declare."""
        declared = {p.name for p in self.route.params if not isinstance(p, PathPart)}
        return {k: v for k, v in self.request.query.items() if k not in declared}


def _bind(route: Route, handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request, Args(route, request))
        except BadParameter as exc:
            return error(400, exc.code, exc.message)

    return handle


class Routes:
    """The routes of one API port, in the order its document lists them."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self._routes = tuple(routes)
        ids = [r.operation_id for r in self._routes]
        if len(ids) != len(set(ids)):
            raise ValueError(f"operation ids must be unique: {sorted(ids)}")

    def __iter__(self) -> Iterator[Route]:
        return iter(self._routes)

    def __getitem__(self, operation_id: str) -> Route:
        for route in self._routes:
            if route.operation_id == operation_id:
                return route
        raise KeyError(operation_id)

    def open_paths(self) -> frozenset[str]:
        return frozenset(r.path for r in self._routes if r.open)

    def serving(self, chosen: Collection[Group]) -> list[Route]:
        return [r for r in self._routes if r.group in chosen]

    def serve(self, app: web.Application, handlers: Mapping[str, Handler], chosen: Collection[Group]) -> None:
        """Add a route for each declaration of the chosen groups, each bound to its handler by operation id.
        A declaration without a handler, or a handler without one, is a mistake in the wiring: it raises."""
        routes = self.serving(chosen)
        declared = {r.operation_id for r in routes}
        if declared != set(handlers):
            raise ValueError(
                f"handlers without a route: {sorted(set(handlers) - declared)}; "
                f"routes without a handler: {sorted(declared - set(handlers))}"
            )
        for route in routes:
            handle = _bind(route, handlers[route.operation_id])
            if route.method == "GET":
                app.router.add_get(route.path, handle)  # and HEAD beside it, as aiohttp does for every GET
            else:
                app.router.add_route(route.method, route.path, handle)
