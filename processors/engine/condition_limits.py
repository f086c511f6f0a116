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
  depends only on the expression and the data, never on a clock.

The estimate follows what cel-rust does (the constants below): converting the values handed
to the program (per JSON node, from counts of the JSON text), deep copies (a field selected,
an element indexed or bound to a comprehension's variable), a comprehension's steps times its
body's bound, the map/filter accumulator (quadratic in what it keeps), linear work of
operators and functions on their operands, a regular expression's automaton. Each constant
is a per-operation cost measured on this machine's cel 0.10 (cel-rust 0.14.5) under load,
charged once: no factor multiplies another, so the bound stays tight (measured time /
estimate 0.3-0.8 on `benchmarks/cel_limits_bench.py`'s corpora) and the budget's distance to
the 50 ms promised is the only margin.

`narrow` hands a program only what it can read: the fields it selects, of each element of
a list a comprehension iterates what the variable reads, nulls for a value only sized or
tested with `has`. The conversion, the dearest part of most evaluations, is then paid for
what is read, and the estimate is computed on the narrowed values.

The parser follows the CEL grammar (cel-spec `langdef.md`); it runs only on expressions
cel has already compiled, so it never decides what is valid CEL, only how large it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import itemgetter
from typing import Any, Final, NamedTuple

import orjson

from processors.engine.errors import ConditionError

MAX_CHARS: Final = 1_000
MAX_DEPTH: Final = 32
MAX_NESTING: Final = 2
MAX_COST_NS: Final = 40_000_000  # the estimate's budget: the worst accepted evaluation stays under ~50 ms

ROOTS: Final = frozenset({"state", "input", "output"})
COMPREHENSIONS: Final = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter"})

# Per-operation costs of this machine's cel 0.10 (cel-rust 0.14.5), in CPU ns, measured by
# benchmarks/cel_limits_bench.py (`--coefficients`) on this 2-core host shared with other
# work: each is about the median measured at a load of 15-25 on 2 cores (where CPU time per
# operation is ~2x an idle host's), charged once, never a factor on a factor (the budget,
# MAX_COST_NS against the 50 ms promised, is the only margin). Three costs drive the model:
# - *conversion* (CV_*): handing a value to a program converts it node by node; a string, a
#   key, an object or an array ~1-2 µs (the binding tries several conversions first), an int
#   ~0.2-0.3 µs, a float ~1 µs;
# - *copy* (CP_*): selecting a field (`input.a`), indexing and binding a comprehension's
#   variable deep-copy the value (~30-70 ns a scalar, ~1-1.5 µs a small object);
# - map / filter copy their accumulator at every step: quadratic in what they keep.
CV_VALUE: Final = 300  # per JSON value or key
CV_FLOAT: Final = 800  # on top, per float (the dearest scalar)
CV_STRING: Final = 1_800  # on top, per string or key
CV_CONTAINER: Final = 1_750  # on top, per object or array
CV_ENTRY: Final = 250  # on top, per key of an object (its insertion)
CV_BYTE: Final = 1  # per byte of JSON text
CP_VALUE: Final = 70  # a deep copy: per value or key
CP_STRING: Final = 180  # on top, per string or key
CP_CONTAINER: Final = 110  # on top, per object or array
CP_ENTRY: Final = 60  # on top, per key of an object
CP_BYTES_PER_NS: Final = 10  # copying strings: 0.1 ns a byte
NS_EXECUTE: Final = 2_000  # one call of the program (the activation, the result's type)
NS_NODE: Final = 150  # one syntax-tree node evaluated once
NS_SELECT: Final = 200  # a field selection or an index, on top of copying what it yields
NS_CALL: Final = 300  # a function or a method, on top of its work on its arguments
NS_ITERATION: Final = 600  # one comprehension step, on top of its body and of binding the element
NS_ACCUMULATE: Final = 80  # map/filter: per result element held, at every step, plus its `acc`:
ACC_STRING: Final = 100  # a string held (shared, not copied) on top of twice its shallow copy
ACC_CONTAINER: Final = 400  # an object or array held, on top (its allocation)
NS_IN_ELEMENT: Final = 40  # `in` a list: per element, on top of comparing it
NS_BYTE: Final = 1  # string work per byte (compare, scan, hash)
NS_REGEX: Final = 2  # matches(): per subject byte and per state of the pattern's automaton
# cel-rust compiles the pattern at every call (no cache): a fixed cost, then the larger of a
# cost per automaton state and one per pattern character (groups and alternations cost ~1.3 us
# a character on an idle host, counted repetitions ~0.3 us a state), with a ~2.5x margin for
# a loaded host (a generated `exists` over 3,000 strings measured 26 us a call under load).
NS_REGEX_CALL: Final = 2_000
NS_REGEX_COMPILE: Final = 600  # per state of the automaton built
NS_REGEX_COMPILE_CHAR: Final = 3_500  # per character of the pattern
# A pattern with an unbounded repetition (`*`, `+`, `{n,}`) after something else builds a
# costlier matcher at every call: `ab*` measured 48 us a call where `ab` takes 8.5 us, `a(b|a)*`
# 55-58 us (idle-ish host at load 7 on 2 cores), whatever the subject. Charged as a floor.
NS_REGEX_REPEAT: Final = 65_000
SCAN_ELEMENTS: Final = 20_000  # a range up to this long has its largest element measured (any list of ints)
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
    _collect_reads(tree, {}, reads)
    return Analysis(tree, {k: (None if v is None else frozenset(v)) for k, v in reads.items()})


# Marks at the end of a read path (never a field name: fields are identifiers): the value there
# is only sized (`size(input.a)`), only tested for presence (`has(input.a)`), or iterated by a
# comprehension (`input.a.exists(x, ...)`, whose variable's reads continue the path after ITEMS).
SIZED: Final = "#size"
PRESENT: Final = "#has"
ITERATED: Final = "#iter"
ITEMS: Final = "*"
_Bound = dict[str, tuple[str, tuple[str, ...]] | None]


def _path(node: Node, bound: _Bound) -> tuple[str, tuple[str, ...]] | None:
    """`state.a.b` -> ("state", ("a", "b")); `x.c` with `x` iterating `input.l` ->
    ("input", ("l", "*", "c")); None for anything else (or a variable bound to a computed range)."""
    fields: list[str] = []
    while node[0] == "select":
        fields.append(node[4])
        node = node[3]
    if node[0] != "ident":
        return None
    name = node[3]
    if name in bound:
        base = bound[name]
        return None if base is None else (base[0], base[1] + tuple(reversed(fields)))
    if name not in ROOTS:
        return None
    return name, tuple(reversed(fields))


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


def _record(reads: dict[str, set[tuple[str, ...]] | None], root: str, fields: tuple[str, ...]) -> None:
    if not fields:
        reads[root] = None
        return
    seen = reads.setdefault(root, set())
    if seen is not None:
        seen.add(fields)


def _is_path(node: Node) -> bool:
    return node[0] in ("select", "ident")


def _collect_reads(node: Node, bound: _Bound, reads: dict[str, set[tuple[str, ...]] | None]) -> None:
    """The field paths each root variable is read through (`Analysis.reads`), a path ending in
    a mark when its value is only sized, tested or iterated. Names bound by a comprehension
    (`x` in `l.all(x, ...)`) shadow a root of the same name."""
    kind = node[0]
    mark, target = None, node
    if kind == "has" and _is_path(node[3]):
        mark, target = PRESENT, node[3]
    elif kind == "call" and node[3] == "size" and len(node[4]) == 1 and _is_path(node[4][0]):
        mark, target = SIZED, node[4][0]
    elif kind == "method" and node[4] == "size" and not node[5] and _is_path(node[3]):
        mark, target = SIZED, node[3]
    path = _path(target, bound) if _is_path(target) else None
    if path is not None:
        _record(reads, path[0], path[1] + ((mark,) if mark else ()))
        return
    if kind == "macro":
        path = _path(node[3], bound) if _is_path(node[3]) else None
        if path is not None:  # the range is iterated: its elements are read through the variable
            _record(reads, path[0], path[1] + (ITERATED,))
        else:
            _collect_reads(node[3], bound, reads)
        inner: _Bound = {**bound, node[5]: None if path is None else (path[0], path[1] + (ITEMS,))}
        for part in node[6]:
            _collect_reads(part, inner, reads)
        return
    for child in _children(node):
        _collect_reads(child, bound, reads)


def free_variables(expr: str) -> frozenset[str]:
    """The identifiers a condition reads that no comprehension binds (`x` in `l.all(x, ...)` is
    bound), e.g. {"state", "stat"} for `state.a && stat.approved`. Raises like `analyze`."""
    found: set[str] = set()

    def walk(node: Node, bound: frozenset[str]) -> None:
        if node[0] == "ident":
            if node[3] not in bound:
                found.add(node[3])
            return
        if node[0] == "macro":
            walk(node[3], bound)
            for part in node[6]:
                walk(part, bound | {node[5]})
            return
        for child in _children(node):
            walk(child, bound)

    walk(analyze(expr).tree, frozenset())
    return frozenset(found)


# ---- narrowing: hand a program only what it reads ----------------------------------------------
# A plan of what to keep of a value: None (all of it), or
#   ("none",)           only its presence was tested: None stands for it
#   ("size",)           only its size was read: a list of as many nulls stands for a list or map
#   ("items", plan)     a list iterated: each element narrowed by plan
#   ("fields", {k: plan}) a map read through fields: only those keys, each narrowed
_Plan = tuple[Any, ...] | None
_NONE: Final = ("none",)
_SIZE: Final = ("size",)


@lru_cache(maxsize=4096)
def _plan(paths: frozenset[tuple[str, ...]] | None) -> _Plan:
    if paths is None:
        return None
    marks: set[str] = set()
    items: set[tuple[str, ...]] | None = set()
    heads: dict[str, set[tuple[str, ...]] | None] = {}
    for path in paths:
        if not path:
            return None
        head, rest = path[0], path[1:]
        if head == ITEMS:
            if not rest:
                items = None
            elif items is not None:
                items.add(rest)
        elif head in (SIZED, PRESENT, ITERATED):
            marks.add(head)
        elif not rest:
            heads[head] = None
        else:
            seen = heads.setdefault(head, set())
            if seen is not None:
                seen.add(rest)
    if heads:
        if marks - {PRESENT} or items != set():
            return None  # sized or iterated too: every entry counts
        return ("fields", {k: _plan(None if v is None else frozenset(v)) for k, v in heads.items()})
    if ITERATED in marks or items != set():
        return ("items", None if items is None else _plan(frozenset(items)) if items else _NONE)
    if SIZED in marks:
        return _SIZE
    return _NONE


def _apply(value: Any, plan: _Plan) -> Any:
    if plan is None:
        return value
    kind = plan[0]
    if kind == "fields":
        if type(value) is not dict:
            return value
        return {key: _apply(value[key], sub) for key, sub in plan[1].items() if key in value}
    if kind == "items":
        sub = plan[1]
        if type(value) is not list or sub is None:
            return value  # a map iterates its keys: all of it
        if sub is _NONE:
            return [None] * len(value)
        if sub[0] == "fields" and all(p is None for p in sub[1].values()):  # the common case, fast
            keys = tuple(sub[1])
            if len(keys) == 1:
                (k,) = keys
                return [({k: e[k]} if k in e else {}) if type(e) is dict else e for e in value]
            return [{k: e[k] for k in keys if k in e} if type(e) is dict else e for e in value]
        return [_apply(e, sub) for e in value]
    if kind == "size":
        return [None] * len(value) if type(value) in (list, dict) else value
    return None


def narrow(value: Any, paths: frozenset[tuple[str, ...]] | None) -> Any:
    """`value` reduced to what a program reading it through `paths` (`Analysis.reads`) can
    see: a map on a path keeps only the keys read (a condition reading `state.a.b` converts
    `b`, not the whole state), a list a comprehension iterates keeps of each element what
    the comprehension's variable reads, a value only sized becomes as many nulls, a value only
    tested with `has` becomes null. The program gives the same answers through those reads
    (a missing key stays missing, a value of another type is kept whole)."""
    return _apply(value, _plan(paths))


# ---- the cost estimate -----------------------------------------------------------------------
_NOTHING: Final = object()
_INFINITE: Final = 10**18
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_UNICODE_CLASS = re.compile(r"\\[A-Za-z]|\.|\[\^")
_UNBOUNDED = re.compile(r"(?<!\\)[*+]|\{\d+,\}")


class _Size(NamedTuple):
    """Bounds of a value: its length (elements, keys or characters), the time to copy it, to
    hold a copy of it in a map/filter accumulator at one step, and to convert it (ns), the
    bytes of its JSON text."""

    n: int
    copy: int
    acc: int
    conv: int
    size: int


class _Est(NamedTuple):
    """A bound of one subexpression: its cost (ns), its value's `_Size`, its largest element's
    when known, the Python value when it is a plain path of the variables, and the values it
    may take when it is a comprehension's variable (or a field of one): the elements of the
    range, so a field of the variable is bounded by that field's values, not the element's."""

    cost: int
    of: _Size
    item: _Size | None = None
    value: Any = _NOTHING
    values: list[Any] | None = None  # the values it may take, when they are known


_SCALARS: Final = frozenset({int, bool, type(None)})
_SCALAR: Final = _Size(1, CP_VALUE, 2 * CP_VALUE, CV_VALUE, 20)
_FLOAT: Final = _Size(1, CP_VALUE, 2 * CP_VALUE, CV_VALUE + CV_FLOAT, 24)
# the characters counted in a value's JSON text (`_size`)
_MARKS: Final = (b"{", b"[", b":", b",", b'"', b".", b"e", b"E")


def _size(counts: tuple[int, ...], n: int, size: int, words: int = 0) -> _Size:
    """Bounds from the counts of `_MARKS` in a JSON text of `size` bytes (`words`: the true and
    false in it): every value and key is the root or follows a bracket, a comma or a colon;
    every string has two quotes; every float a `.` or an `e`. The same characters inside
    strings only raise the bounds."""
    objects, arrays, keys, commas, quotes, dots, e, big_e = counts
    values = commas + keys + objects + arrays + 1
    strings = quotes // 2
    floats = max(dots + e + big_e - words, 0)
    containers = objects + arrays
    shallow = CP_VALUE * values + CP_CONTAINER * containers + CP_ENTRY * keys
    return _Size(
        n,
        shallow + CP_STRING * strings + size // CP_BYTES_PER_NS,
        2 * shallow + ACC_STRING * strings + ACC_CONTAINER * containers,
        CV_VALUE * values
        + CV_FLOAT * floats
        + CV_STRING * strings
        + CV_CONTAINER * containers
        + CV_ENTRY * keys
        + CV_BYTE * size,
        size,
    )


def _profile(raw: bytes, n: int) -> _Size:
    words = raw.count(b"true") + raw.count(b"false")
    return _size(tuple(raw.count(m) for m in _MARKS), n, len(raw), words)


def _dumps(name: str, value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise ConditionError(f"{name} holds a value a condition cannot read ({exc})") from None


def _length(value: Any) -> int:
    return len(value) if isinstance(value, (list, dict, str, bytes)) else 1


class _Sizes:
    """The bounds of the variables' values, each computed once per estimate (by identity: the
    values live as long as the estimate)."""

    def __init__(self) -> None:
        self.whole: dict[int, _Size] = {}
        self.items: dict[int, _Size | None] = {}

    def of(self, value: Any) -> _Size:
        key = id(value)
        found = self.whole.get(key)
        if found is None:
            t = type(value)
            if t is int or t is bool or value is None:
                found = _SCALAR
            elif t is float:
                found = _FLOAT
            else:
                found = _profile(_dumps("a variable", value), _length(value))
            self.whole[key] = found
        return found

    def item(self, value: Any) -> _Size | None:
        """A bound of every element of a list, or key of a map (what a comprehension binds):
        each count the largest any element has (a sum of maxima bounds the maximum of sums);
        None when the value is neither or too long to measure."""
        key = id(value)
        if key in self.items:
            return self.items[key]
        t = type(value)
        found: _Size | None = None
        if t is list and set(map(type, value)) <= _SCALARS:
            found = _SCALAR  # however long: the check is cheap
        elif (t is list or t is dict) and len(value) <= SCAN_ELEMENTS:
            found = _every(value if t is list else list(value))
        self.items[key] = found
        return found


def _every(elements: list[Any]) -> _Size:
    """A bound of every value of `elements` (each count the largest any has)."""
    types = set(map(type, elements))  # at C speed: this runs on every element
    if types <= _SCALARS:
        return _SCALAR
    if types == {str}:
        chars = max(map(len, elements))
        size = 6 * chars + 2  # a character is at most 6 bytes of JSON (an escape)
        return _Size(
            chars,
            CP_VALUE + CP_STRING + size // CP_BYTES_PER_NS,
            2 * CP_VALUE + ACC_STRING,
            CV_VALUE + CV_STRING + CV_BYTE * size,
            size,
        )
    return _largest(elements, types == {dict})


def _largest(elements: list[Any], objects: bool) -> _Size:
    """Each count the largest any element's JSON text has (a sum of maxima bounds the maximum
    of sums). Flat objects (no object inside one, no brace in a string: the text then has
    exactly one `{` per element), the common case, in one text split at `},{`: an object of
    k keys has k colons, k - 1 commas, at most k floats, and its quotes are counted; others
    one by one."""
    raw = orjson.dumps(elements)
    n = len(elements)
    if objects and raw.count(b"{") == n == raw.count(b"}") and raw.count(b"[") == 1:
        keys = max(map(len, elements))
        parts = raw[2:-2].split(b"},{")
        quotes = max(map(bytes.count, parts, repeat(b'"')))
        counts = (1, 0, keys, max(keys - 1, 0), quotes, keys, 0, 0)
        return _size(counts, max(keys, 1), max(map(len, parts)) + 2)
    raws = [orjson.dumps(e) for e in elements]
    # a mark the whole text lacks no element has: skip it
    marks = tuple(max(map(bytes.count, raws, repeat(m))) if raw.count(m) else 0 for m in _MARKS)
    return _size(marks, max(max(map(_length, elements)), 1), max(map(len, raws)))


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
    them, evaluating the tree, converting its result back (module doc). Raises
    ConditionError for a value JSON cannot hold (it could not be converted either)."""
    sizes = _Sizes()
    total = NS_EXECUTE
    for name, value in variables.items():
        if type(value) in (dict, list, str):
            whole = _profile(_dumps(name, value), _length(value))
            sizes.whole[id(value)] = whole
        else:
            whole = sizes.of(value)
        total += whole.conv
    est = _Estimator(variables, sizes).estimate(tree, {})
    return total + est.cost + est.of.conv


def _within(s: _Size) -> _Size:
    """A bound of any part of a value bounded by `s` (a field, an element): as long as two
    bytes of its text (`[1,2]`) allow."""
    return s._replace(n=s.size // 2 + 1)


def _plus(a: _Size, b: _Size) -> _Size:
    return _Size(a.n + b.n, a.copy + b.copy, a.acc + b.acc, a.conv + b.conv, a.size + b.size)


def _larger(a: _Size | None, b: _Size | None) -> _Size | None:
    if a is None or b is None:
        return None
    return _Size(*map(max, a, b))


def _literal(node: Node) -> str | None:
    """The text of a string literal node's source, when the parser kept it."""
    return node[4] if node[0] == "lit" and len(node) > 4 else None


class _Var:
    """A comprehension variable: the values it may take (the range's elements, when known) and
    the bound of each, measured only if the body uses the variable otherwise than through its
    fields (that takes a scan of the values)."""

    __slots__ = ("_bound", "_make", "values")

    def __init__(self, values: list[Any] | None, make: Callable[[], _Size]) -> None:
        self.values = values
        self._make = make
        self._bound: _Size | None = None

    @property
    def bound(self) -> _Size:
        if self._bound is None:
            self._bound = self._make()
        return self._bound


_Env = dict[str, _Var]


class _Estimator:
    def __init__(self, variables: dict[str, Any], sizes: _Sizes) -> None:
        self.variables = variables
        self.sizes = sizes

    def known(self, cost: int, value: Any) -> _Est:
        return _Est(cost, self.sizes.of(value), None, value)

    def item(self, est: _Est) -> _Size | None:
        """The bound of `est`'s elements when it is known (measured on demand: it scans the value)."""
        if est.item is not None or est.value is _NOTHING:
            return est.item
        return self.sizes.item(est.value)

    def estimate(self, node: Node, env: _Env) -> _Est:
        kind = node[0]
        est = self.estimate
        if kind == "lit":
            text = node[3]
            if len(node) > 4 and node[4] is not None:  # a string
                return _Est(
                    NS_NODE,
                    _Size(
                        text,
                        CP_VALUE + CP_STRING + text // CP_BYTES_PER_NS,
                        2 * CP_VALUE + ACC_STRING,
                        CV_VALUE + CV_STRING + CV_BYTE * text,
                        text,
                    ),
                )
            return _Est(
                NS_NODE, _Size(1, CP_VALUE, 2 * CP_VALUE, CV_VALUE + CV_FLOAT, text)
            )  # a number, bool, null
        if kind == "ident":
            name = node[3]
            if name in env:
                var = env[name]
                return _Est(NS_NODE, var.bound, None, _NOTHING, var.values)
            if name in self.variables:
                return self.known(NS_NODE, self.variables[name])
            return _Est(NS_NODE, _SCALAR)  # a type name
        if kind in ("select", "index"):
            operand = node[3]
            bound_var = env.get(operand[3]) if operand[0] == "ident" else None
            if kind == "select" and bound_var is not None and bound_var.values is not None:
                base = _Est(NS_NODE, _SCALAR, None, _NOTHING, bound_var.values)  # its field's values bound it
            else:
                base = est(operand, env)
            cost = base.cost + NS_SELECT
            key: Any = node[4] if kind == "select" else _NOTHING
            if kind == "index":
                k = est(node[4], env)
                cost += k.cost + NS_BYTE * k.of.size  # hashing or comparing the key
            value = base.value
            if key is not _NOTHING and type(value) is dict and key in value:
                found = self.known(0, value[key])
                return found._replace(cost=cost + found.of.copy)
            if key is not _NOTHING and base.values is not None:  # a field of a variable's values
                try:  # at C speed when every value has the field
                    sub = list(map(itemgetter(key), base.values))
                except (KeyError, TypeError, IndexError):
                    sub = [v[key] for v in base.values if type(v) is dict and key in v]
                bound = _every(sub)
                return _Est(cost + bound.copy, bound, None, _NOTHING, sub)
            element = self.item(base) if kind == "index" else None
            if element is not None:  # an element: bounded by the largest
                return _Est(cost + element.copy, element)
            part = _within(base.of)
            return _Est(cost + part.copy, part)
        if kind == "has":
            base = est(node[3], env)
            return _Est(base.cost, _SCALAR)
        if kind == "macro":
            return self.macro(node, env)
        parts = [est(child, env) for child in _children(node)]
        cost = NS_NODE + sum(p.cost for p in parts)
        if kind == "unary":
            return _Est(cost, _SCALAR)
        if kind == "binary":
            op = node[3]
            a, b = parts[0].of, parts[1].of
            if op in ("&&", "||"):
                return _Est(cost, _SCALAR)
            if op == "+":  # concatenation copies both sides
                return _Est(cost + a.copy + b.copy, _plus(a, b), _larger(parts[0].item, parts[1].item))
            if op == "in":  # a scan of the right side, comparing the left with each element
                return _Est(cost + NS_IN_ELEMENT * b.n + b.copy + NS_BYTE * b.size, _SCALAR)
            if op in _RELATIONS:  # a comparison stops at the shorter side
                return _Est(cost + min(a.copy, b.copy) + NS_BYTE * min(a.size, b.size), _SCALAR)
            return _Est(cost, _SCALAR)  # arithmetic
        if kind == "cond":
            then, other = parts[1], parts[2]
            return _Est(cost, _larger(then.of, other.of) or then.of, _larger(then.item, other.item))
        if kind in ("list", "map", "struct"):
            item: _Size | None = _SCALAR
            of = _Size(len(parts), CP_CONTAINER, 2 * CP_CONTAINER + ACC_CONTAINER, CV_CONTAINER, 2)
            for p in parts:
                of = _plus(of, p.of)
                item = _larger(item, p.of)
            return _Est(cost, of._replace(n=len(parts), size=of.size + len(parts)), item)
        name = node[3] if kind == "call" else node[4]
        cost += NS_CALL
        if name == "size":
            return _Est(cost, _SCALAR)
        args = _Size(0, 0, 0, 0, 0)
        for p in parts:
            args = _plus(args, p.of)
        cost += args.copy + NS_BYTE * args.size
        if name == "matches":  # subject bytes x the automaton's states, plus building it
            last = parts[-1].value
            pattern = last if isinstance(last, str) else _literal(_children(node)[-1])
            states = regex_states(pattern) if isinstance(pattern, str) else _INFINITE
            subject = parts[0].of.size if len(parts) > 1 else 0
            compile_ns = NS_REGEX_COMPILE * states
            if isinstance(pattern, str):
                compile_ns = max(compile_ns, NS_REGEX_COMPILE_CHAR * len(pattern))
                if _UNBOUNDED.search(pattern):
                    compile_ns = max(compile_ns, NS_REGEX_REPEAT)
            cost += NS_REGEX * (subject + 1) * states + NS_REGEX_CALL + compile_ns
        # a function or method: at most linear in its arguments, its result at most their size
        return _Est(cost, args)

    def macro(self, node: Node, env: _Env) -> _Est:
        rng = self.estimate(node[3], env)
        n, values = rng.of.n, None
        make: Callable[[], _Size] = lambda: self.item(rng) or _within(rng.of)  # noqa: E731
        if rng.value is not _NOTHING and type(rng.value) in (list, dict) and len(rng.value) <= SCAN_ELEMENTS:
            values = rng.value if type(rng.value) is list else list(rng.value)
        elif rng.values is not None:  # a field of an outer variable: its elements, all of them
            flat: list[Any] = []
            for v in rng.values:
                if type(v) is list or type(v) is dict:
                    flat.extend(v)
            if len(flat) <= SCAN_ELEMENTS:
                values = flat
                make = lambda: _every(flat)  # noqa: E731
        var = _Var(values, make)
        inner = {**env, node[5]: var}
        body_cost, result = 0, _SCALAR
        for part in node[6]:
            b = self.estimate(part, inner)
            body_cost += b.cost
            result = b.of
        # binding each element copies it: together at most a copy of the range
        cost = rng.cost + NS_NODE + n * (NS_ITERATION + body_cost) + rng.of.copy
        if node[4] in ("map", "filter"):
            kept = result if node[4] == "map" else var.bound
            # the accumulator is copied at every step: up to n results, n times (for a filter,
            # the elements it keeps at most all of them at each step)
            steps = n * (n + 1) // 2
            held = steps * kept.acc if node[4] == "map" else min(steps * kept.acc, n * rng.of.acc)
            cost += steps * NS_ACCUMULATE + held
            of = _Size(
                n,
                CP_CONTAINER + n * kept.copy,
                2 * CP_CONTAINER + ACC_CONTAINER + n * kept.acc,
                CV_CONTAINER + n * kept.conv,
                2 + n * (kept.size + 1),
            )
            return _Est(cost, of, kept)
        return _Est(cost, _SCALAR)
