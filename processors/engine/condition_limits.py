"""Bounds on route conditions: what a definition may register, and how much work one
evaluation may do.

The `cel` binding (cel-rust) has no cost limit, exposes no syntax tree and runs a
program to its end holding the GIL, so a condition must be judged before it runs:

- **At registration** (`analyze`): at most `MAX_CHARS` characters, a syntax tree at most
  `MAX_DEPTH` levels deep, and at most `MAX_NESTING` comprehension macros (`all`,
  `exists`, `exists_one`, `map`, `filter`) on any path of the tree (one inside another's
  range or body). Refused with the rule's name (`ConditionLimit.rule`).
- **At every evaluation** (`estimate_ns`): an upper bound of the evaluation's time, from
  the tree and the sizes of the values it is handed; over `MAX_COST_NS` the condition is
  not run and fails (`ConditionLimit`, rule `condition_cost`). Deterministic: the bound
  depends only on the expression and the data, never on a clock. The coefficients are
  per-operation upper bounds measured on cel 0.10 (cel-rust 0.14.5) with a margin
  (`benchmarks/cel_limits_bench.py` re-measures them and the worst accepted case).

Two costs of cel-rust drive the model: handing a value to a program converts it node by
node (~1.5-3 µs an object, string or key: the binding tries up to nine conversions
first), and `map` / `filter` copy their accumulator at every step (quadratic: 1,000 items
take ~50 ms). `narrow` hands a program only the parts of `state`, `input` and `output`
it reads through field selections, so the conversion is paid for what is read.

The parser follows the CEL grammar (cel-spec `langdef.md`); it runs only on expressions
cel has already compiled, so it never decides what is valid CEL, only how large it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import orjson

from processors.engine.errors import ConditionError

MAX_CHARS: Final = 1_000
MAX_DEPTH: Final = 32
MAX_NESTING: Final = 2
MAX_COST_NS: Final = 40_000_000  # the estimate's budget: the worst accepted evaluation stays under ~50 ms

ROOTS: Final = frozenset({"state", "input", "output"})
COMPREHENSIONS: Final = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter"})

# Upper bounds on this machine's cel 0.10, measured by benchmarks/cel_limits_bench.py, with
# a margin. A value's *weight* is the bound of the time to hand it to a program (ns,
# `conversion_ns`): what an operation does per element (compare, copy, scan) costs a part of
# what converting that element did, so per-element work is charged as a factor of the weight
# (objects cost ~10x integers either way). Strings are also charged per byte.
NS_CONVERT_VALUE: Final = 1_200  # per JSON value or key (the dearest scalar: a float)
NS_CONVERT_OBJECT: Final = 2_200  # on top, per object, array and string: the binding tries
NS_CONVERT_ARRAY: Final = 1_100  # up to nine conversions before those
NS_CONVERT_STRING: Final = 2_400
NS_NODE: Final = 200  # one syntax-tree node evaluated once
NS_ACCESS: Final = 150  # reading a variable or a field that holds a list or map: per entry (a copy)
NS_ITERATION: Final = 150  # one comprehension step, on top of its body and of K_ITERATE
NS_BYTE: Final = 3  # string work per byte (compare, copy, search, size)
K_ITERATE: Final = 0.5  # binding an element to the comprehension variable
K_COMPARE: Final = 0.4  # ==, !=, <, in: per element compared
K_COPY: Final = 0.4  # + and accumulating map/filter results: per element copied
K_CALL: Final = 0.5  # a function or method: per element of its arguments
NS_REGEX: Final = 2  # matches(): per subject byte and per state of the pattern's automaton
NS_REGEX_COMPILE: Final = 100  # per state of the automaton built
NS_CONVERT_BYTE: Final = 1_800  # the weight bound per byte of any JSON value (the dearest: "")
SCAN_ELEMENTS: Final = 20_000  # a range up to this long has its largest element measured
REGEX_CLASS_STATES: Final = 300  # a Unicode class (\w, \d, \pL, ., [^...]) as automaton states


class ConditionLimit(ConditionError):
    """A condition over one of the bounds; `rule` names which (condition_length,
    condition_depth, condition_nesting, condition_cost)."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


# ---- the syntax tree ------------------------------------------------------------------------
# Nodes are tuples: (kind, depth, nesting, *parts). kind is one of
#   lit (size,), ident (name,), select (operand, field), index (operand, key),
#   call (name, args), method (target, name, args), macro (target, name, var, args),
#   has (operand,), unary (op, operand), binary (op, left, right), cond (test, then, else),
#   list (items,), map (entries: tuple of (key, value)), struct (fields: tuple of values)
Node = tuple[Any, ...]

_TOKEN = re.compile(
    r"""(?P<ws>\s+|//[^\n]*)"""
    r"""|(?P<str>[rRbB]{0,2}(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))"""
    r"""|(?P<num>0[xX][0-9a-fA-F]+[uU]?|\d*\.\d+(?:[eE][+-]?\d+)?|\d+\.?(?:[eE][+-]?\d+)|\d+[uU]?)"""
    r"""|(?P<id>[A-Za-z_][A-Za-z0-9_]*)"""
    r"""|(?P<op>==|!=|<=|>=|&&|\|\||[-+*/%!<>?:.,\[\]{}()])"""
)
_LITERAL_WORDS: Final = frozenset({"true", "false", "null"})
_RELATIONS: Final = frozenset({"<", "<=", ">", ">=", "==", "!=", "in"})


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ConditionError(f"condition {expr[:80]!r}: cannot read {expr[pos : pos + 10]!r} at {pos}")
        kind = m.lastgroup
        assert kind is not None
        if kind != "ws":
            out.append((kind, m.group()))
        pos = m.end()
    out.append(("end", ""))
    return out


def _node(kind: str, children: tuple[Node, ...], *parts: Any, macro: bool = False) -> Node:
    depth = 1 + max((c[1] for c in children), default=0)
    if depth > MAX_DEPTH:
        raise _TooDeep
    nesting = max((c[2] for c in children), default=0) + (1 if macro else 0)
    return (kind, depth, nesting, *parts)


def _string_value(text: str) -> str | None:
    """A string literal's text between its quotes (escapes kept): a regex pattern's bound is
    computed from it, and the escapes only lengthen it; None for a bytes literal."""
    prefix = len(text) - len(text.lstrip("rRbB"))
    if "b" in text[:prefix].lower():
        return None
    body = text[prefix:]
    quote = 3 if body[:3] in ("'''", '"""') else 1
    return body[quote:-quote]


class _TooDeep(Exception):
    pass


class _Parser:
    def __init__(self, expr: str) -> None:
        self.toks = _tokens(expr)
        self.i = 0
        self.open = 0  # brackets open: bounds the recursion before any node is built

    def peek(self, k: int = 0) -> tuple[str, str]:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self, text: str | None = None) -> tuple[str, str]:
        tok = self.toks[self.i]
        if text is not None and tok[1] != text:
            raise ConditionError(f"expected {text!r}, found {tok[1] or 'the end'!r}")
        self.i += 1
        return tok

    def at(self, text: str) -> bool:
        return self.toks[self.i][1] == text and self.toks[self.i][0] in ("op", "id")

    def enter(self) -> None:
        self.open += 1
        if self.open > MAX_DEPTH:
            raise _TooDeep

    def expr(self) -> Node:
        test = self.binary(0)
        if self.at("?"):
            self.take()
            then = self.binary(0)
            self.take(":")
            other = self.expr()
            return _node("cond", (test, then, other), test, then, other)
        return test

    _LEVELS: Final = (
        frozenset({"||"}),
        frozenset({"&&"}),
        _RELATIONS,
        frozenset({"+", "-"}),
        frozenset({"*", "/", "%"}),
    )

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        ops = self._LEVELS[level]
        while self.peek()[1] in ops and self.peek()[0] in ("op", "id"):
            op = self.take()[1]
            right = self.binary(level + 1)
            left = _node("binary", (left, right), op, left, right)
        return left

    def unary(self) -> Node:
        ops: list[str] = []
        while self.at("!") or self.at("-"):
            ops.append(self.take()[1])
        operand = self.member()
        for op in reversed(ops):
            operand = _node("unary", (operand,), op, operand)
        return operand

    def args(self, close: str) -> tuple[Node, ...]:
        self.enter()
        items: list[Node] = []
        while not self.at(close):
            items.append(self.expr())
            if not self.at(","):
                break
            self.take(",")
        self.take(close)
        self.open -= 1
        return tuple(items)

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.at("."):
                self.take()
                name = self.take()[1]
                if self.at("("):
                    self.take()
                    args = self.args(")")
                    node = self.call_on(node, name, args)
                else:
                    node = _node("select", (node,), node, name)
            elif self.at("["):
                self.take()
                self.enter()
                key = self.expr()
                self.take("]")
                self.open -= 1
                node = _node("index", (node, key), node, key)
            elif self.at("{") and node[0] in ("ident", "select"):
                self.take()
                fields = self.inits("}", keyed=False)
                node = _node("struct", fields, fields)
            else:
                return node

    def call_on(self, target: Node, name: str, args: tuple[Node, ...]) -> Node:
        if name in COMPREHENSIONS and len(args) in (2, 3) and args[0][0] == "ident":
            body = args[1:]
            return _node("macro", (target, *body), target, name, args[0][3], body, macro=True)
        return _node("method", (target, *args), target, name, args)

    def inits(self, close: str, keyed: bool) -> tuple[Node, ...]:
        """`{k: v, ...}` (keyed) or a message's `{field: v, ...}`: the values (and keys)."""
        self.enter()
        parts: list[Node] = []
        while not self.at(close):
            if keyed:
                parts.append(self.expr())
            else:
                self.take()  # the field name
            self.take(":")
            parts.append(self.expr())
            if not self.at(","):
                break
            self.take(",")
        self.take(close)
        self.open -= 1
        return tuple(parts)

    def primary(self) -> Node:
        kind, text = self.take()
        if kind == "str":
            return _node("lit", (), len(text), _string_value(text))
        if kind == "num":
            return _node("lit", (), len(text))
        if kind == "id":
            if text in _LITERAL_WORDS:
                return _node("lit", (), len(text))
            if self.at("("):
                self.take()
                args = self.args(")")
                if text == "has" and len(args) == 1:
                    return _node("has", args, args[0])
                return _node("call", args, text, args)
            return _node("ident", (), text)
        if text == ".":  # a leading dot: the root scope
            return self.primary()
        if text == "(":
            self.enter()
            inner = self.expr()
            self.take(")")
            self.open -= 1
            return inner
        if text == "[":
            items = self.args("]")
            return _node("list", items, items)
        if text == "{":
            entries = self.inits("}", keyed=True)
            return _node("map", entries, entries)
        raise ConditionError(f"unexpected {text or 'end'!r}")


@dataclass(frozen=True, slots=True)
class Analysis:
    """What the runtime needs to know about a compiled condition."""

    tree: Node
    # root variable -> the field paths read from it (a path ends where the value is used
    # whole); None: the variable is used whole
    reads: dict[str, frozenset[tuple[str, ...]] | None]

    @property
    def depth(self) -> int:
        return int(self.tree[1])

    @property
    def nesting(self) -> int:
        return int(self.tree[2])


def analyze(expr: str) -> Analysis:
    """The tree of a condition cel compiled, checked against the registration limits.
    Raises `ConditionLimit` naming the rule."""
    if len(expr) > MAX_CHARS:
        raise ConditionLimit(
            "condition_length", f"condition is {len(expr)} characters; the limit is {MAX_CHARS}"
        )
    parser = _Parser(expr)
    try:
        tree = parser.expr()
        parser.take("")
    except _TooDeep:
        raise ConditionLimit(
            "condition_depth",
            f"condition nests more than {MAX_DEPTH} levels deep "
            "(operators, calls, selections and brackets each add one)",
        ) from None
    except ConditionError as exc:
        raise ConditionError(
            f"condition {expr[:80]!r} is beyond what runfold can bound: {exc.message}"
        ) from None
    if tree[2] > MAX_NESTING:
        raise ConditionLimit(
            "condition_nesting",
            f"condition nests {tree[2]} comprehension macros (all, exists, "
            f"exists_one, map, filter) inside each other; the limit is {MAX_NESTING}",
        )
    reads: dict[str, set[tuple[str, ...]] | None] = {}
    _collect_reads(tree, frozenset(), reads)
    return Analysis(tree, {k: (None if v is None else frozenset(v)) for k, v in reads.items()})


def _path(node: Node) -> tuple[str, tuple[str, ...]] | None:
    """`state.a.b` -> ("state", ("a", "b")); None for anything else."""
    fields: list[str] = []
    while node[0] == "select":
        fields.append(node[4])
        node = node[3]
    if node[0] != "ident":
        return None
    return node[3], tuple(reversed(fields))


def _children(node: Node) -> tuple[Node, ...]:
    kind = node[0]
    if kind in ("lit", "ident"):
        return ()
    if kind == "select":
        return (node[3],)
    if kind == "index":
        return (node[3], node[4])
    if kind == "call":
        return tuple(node[4])
    if kind == "method":
        return (node[3], *node[5])
    if kind == "macro":
        return (node[3], *node[6])
    if kind in ("has", "unary"):
        return (node[-1],)
    if kind == "binary":
        return (node[4], node[5])
    if kind == "cond":
        return tuple(node[3:6])
    return tuple(node[3])  # list, map, struct


def _collect_reads(node: Node, bound: frozenset[str], reads: dict[str, set[tuple[str, ...]] | None]) -> None:
    """The field paths each root variable is read through (`Analysis.reads`). Names bound
    by a comprehension (`x` in `l.all(x, ...)`) shadow a root of the same name."""
    target = node[3] if node[0] == "has" else node
    path = _path(target) if target[0] in ("select", "ident") else None
    if path is not None:
        root, fields = path
        if root in ROOTS and root not in bound:
            seen = reads.setdefault(root, set())
            if seen is not None:
                if fields:
                    seen.add(fields)
                else:
                    reads[root] = None
        return
    if node[0] == "macro":
        _collect_reads(node[3], bound, reads)
        for part in node[6]:
            _collect_reads(part, bound | {node[5]}, reads)
        return
    for child in _children(node):
        _collect_reads(child, bound, reads)


# ---- narrowing: hand a program only what it reads ----------------------------------------------
def narrow(value: Any, paths: frozenset[tuple[str, ...]] | None) -> Any:
    """`value` reduced to the objects on `paths` (each path's end whole). A dict on a path
    keeps only the keys read, so a condition reading `state.a.b` converts `b`, not the
    whole state; it sees the same values through those selections (a missing key stays
    missing)."""
    if paths is None or type(value) is not dict:
        return value
    out: dict[str, Any] = {}
    heads: dict[str, set[tuple[str, ...]] | None] = {}
    for path in paths:
        rest = path[1:]
        if not rest:
            heads[path[0]] = None
        else:
            seen = heads.setdefault(path[0], set())
            if seen is not None:
                seen.add(rest)
    for key, rests in heads.items():
        if key in value:
            out[key] = narrow(value[key], None if rests is None else frozenset(rests))
    return out


# ---- the cost estimate -----------------------------------------------------------------------
_NOTHING: Final = object()
_INFINITE: Final = 10**18
# A bound of one subexpression: (cost ns, elements: its length or element count, weight: the
# bound of converting it (ns), bytes, the Python value when it is a plain path of the variables)
_Est = tuple[int, int, int, int, Any]
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_UNICODE_CLASS = re.compile(r"\\[A-Za-z]|\.|\[\^")


def conversion_ns(raw: bytes) -> int:
    """An upper bound of the time to hand the JSON value `raw` to a program. Every value
    and key is the root or follows a bracket, a comma or a colon; every string has two
    quotes. The same characters inside strings only raise the bound."""
    objects, arrays = raw.count(b"{"), raw.count(b"[")
    values = raw.count(b",") + raw.count(b":") + objects + arrays + 1
    return (
        NS_CONVERT_VALUE * values
        + NS_CONVERT_OBJECT * objects
        + NS_CONVERT_ARRAY * arrays
        + NS_CONVERT_STRING * (raw.count(b'"') // 2)
    )


def regex_states(pattern: str) -> int:
    """An upper bound of the automaton's states for `pattern`: its length times every counted
    repetition in it (nested ones multiply; sequential ones are counted as if nested), a
    Unicode class counted as `REGEX_CLASS_STATES` characters."""
    states = len(pattern) + 1
    if _UNICODE_CLASS.search(pattern):
        states *= REGEX_CLASS_STATES
    for m in _QUANTIFIER.finditer(pattern):
        low, high = int(m.group(1)), m.group(2)
        states *= max(low + 1, int(high) if high else low + 1, 1)
        if states > _INFINITE:
            return _INFINITE
    return states


def estimate_ns(tree: Node, variables: dict[str, Any]) -> int:
    """An upper bound of the time (ns) a program of `tree` takes on `variables`: converting
    them, then evaluating the tree (module doc). Raises ConditionError for a value JSON
    cannot hold (it could not be converted either)."""
    total = 0
    sizes: dict[str, tuple[int, int]] = {}
    for name, value in variables.items():
        try:
            raw = orjson.dumps(value)
        except TypeError as exc:
            raise ConditionError(f"{name} holds a value a condition cannot read ({exc})") from None
        weight = conversion_ns(raw)
        sizes[name] = (weight, len(raw))
        total += weight
    cost, _, weight, _, _ = _estimate(tree, variables, sizes, {})
    return total + cost + int(K_CALL * weight)  # the result is handed back to Python, bool or not


def _element(value: Any, w: int, b: int) -> tuple[int, int, int]:
    """A bound of one element of a comprehension's range (elements, weight, bytes): from the
    largest element when the range is a list or map of the variables (a map's elements are
    its keys) of at most `SCAN_ELEMENTS`, else the whole range's."""
    items = value if type(value) is list else list(value) if type(value) is dict else None
    if items is None or len(items) > SCAN_ELEMENTS:
        return b, w, b
    largest = max((len(orjson.dumps(item)) for item in items), default=1)  # the whole dumped: each does
    return largest, min(w, NS_CONVERT_BYTE * largest), largest


def _entries(value: Any) -> int:
    """What reading a list or map costs in cel-rust: it copies its entries (a map of 2,654
    entries read in a comprehension's body took ~0.2 ms at every step)."""
    return len(value) if type(value) in (list, dict) else 0


def _count(value: Any, bound: int) -> int:
    return len(value) if isinstance(value, (list, dict, str, bytes)) else min(bound, 1)


def _literal(node: Node) -> str | None:
    """The text of a string literal node's source, when the parser kept it."""
    return node[4] if node[0] == "lit" and len(node) > 4 else None


def _estimate(
    node: Node,
    variables: dict[str, Any],
    sizes: dict[str, tuple[int, int]],
    env: dict[str, tuple[int, int, int]],
) -> _Est:
    kind = node[0]
    est = _estimate
    if kind == "lit":
        return NS_NODE, node[3], NS_CONVERT_VALUE + NS_CONVERT_STRING, node[3], _NOTHING
    if kind == "ident":
        name = node[3]
        if name in env:
            n, w, b = env[name]
            return NS_NODE + NS_ACCESS * (b // 2), n, w, b, _NOTHING
        if name in variables:
            value = variables[name]
            w, b = sizes[name]
            return NS_NODE + NS_ACCESS * _entries(value), _count(value, b), w, b, value
        return NS_NODE, 1, NS_CONVERT_VALUE, 1, _NOTHING
    if kind in ("select", "index"):
        c, n, w, b, value = est(node[3], variables, sizes, env)
        key: Any = node[4] if kind == "select" else _NOTHING
        if kind == "index":
            ck, _, wk, bk, _ = est(node[4], variables, sizes, env)
            c += ck + int(K_COMPARE * wk) + NS_BYTE * bk  # hashing or comparing the key
        if key is not _NOTHING and type(value) is dict and key in value:
            sub = value[key]
            return c + NS_NODE + NS_ACCESS * _entries(sub), _count(sub, b), w, b, sub
        return c + NS_NODE + NS_ACCESS * (b // 2), b, w, b, _NOTHING
    if kind == "has":
        c = est(node[3], variables, sizes, env)[0]
        return c + NS_NODE, 1, NS_CONVERT_VALUE, 1, _NOTHING
    if kind == "macro":
        cr, n, w, b, value = est(node[3], variables, sizes, env)
        inner = {**env, node[5]: _element(value, w, b)}
        body_cost, result = 0, (1, NS_CONVERT_VALUE, 1)
        for part in node[6]:
            cb, nb, wb, bb, _ = est(part, variables, sizes, inner)
            body_cost += cb
            result = (nb, wb, bb)
        cost = cr + NS_NODE + n * (NS_ITERATION + body_cost) + int(K_ITERATE * w)
        if node[4] == "map":  # the accumulator is copied at every step: n results, n times
            cost += int(K_COPY * n * n * result[1])
            return cost, n, n * result[1], n * result[2], _NOTHING
        if node[4] == "filter":
            cost += int(K_COPY * n * w)
            return cost, n, w, b, _NOTHING
        return cost, 1, NS_CONVERT_VALUE, 1, _NOTHING
    parts = [est(child, variables, sizes, env) for child in _children(node)]
    cost = NS_NODE + sum(p[0] for p in parts)
    if kind == "unary":
        return cost, 1, NS_CONVERT_VALUE, 1, _NOTHING
    if kind == "binary":
        op = node[3]
        (_, na, wa, ba, _), (_, nb, wb, bb, _) = parts
        if op in ("&&", "||"):
            return cost, 1, NS_CONVERT_VALUE, 1, _NOTHING
        if op == "+":  # concatenation copies both sides
            cost += int(K_COPY * (wa + wb)) + NS_BYTE * (ba + bb)
            return cost, na + nb, wa + wb, ba + bb, _NOTHING
        if op == "in":  # a scan of the right side, comparing the left with each element
            cost += int(K_COMPARE * (wa + wb)) + NS_BYTE * (ba + bb)
        else:  # a comparison stops at the shorter side
            cost += int(K_COMPARE * min(wa, wb)) + NS_BYTE * min(ba, bb)
        return cost, 1, NS_CONVERT_VALUE, 1, _NOTHING
    if kind == "cond":
        _, (_, na, wa, ba, _), (_, nb, wb, bb, _) = parts
        return cost, max(na, nb), max(wa, wb), max(ba, bb), _NOTHING
    elements = sum(p[1] for p in parts)
    weight = sum(p[2] for p in parts)
    size = sum(p[3] for p in parts)
    if kind in ("list", "map", "struct"):
        return cost, len(parts), weight + NS_CONVERT_ARRAY, size + len(parts) + 1, _NOTHING
    name = node[3] if kind == "call" else node[4]
    cost += int(K_CALL * weight) + NS_BYTE * size
    if name == "matches":  # subject bytes x the automaton's states, plus building it
        pattern = parts[-1][4] if isinstance(parts[-1][4], str) else _literal(_children(node)[-1])
        states = regex_states(pattern) if isinstance(pattern, str) else _INFINITE
        subject = parts[0][3] if len(parts) > 1 else 0
        cost += NS_REGEX * (subject + 1) * states + NS_REGEX_COMPILE * states
    # a function or method: at most linear in its arguments, its result at most their size
    return cost, elements, weight, size, _NOTHING
