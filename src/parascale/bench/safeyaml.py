"""Reading a YAML study file without surprises: duplicate keys, alias bombs, recursive aliases.

``yaml.safe_load`` constructs no arbitrary objects, but it still lets the last of two equal keys
win silently, and its aliases are shared references: nine levels of ``&a [*h, *h, ...]`` in
600 bytes stand for hundreds of millions of values, which the planner then copies one by one.
So the document is composed into its node graph first (aliases are still shared there), checked
(:func:`vet`: duplicate keys, aliases inside their own anchor, nesting depth, and the size with
every alias expanded, counted once per node), and only then constructed. Problems raise
:class:`parascale.safejson.Refused` with one line saying what and where; the study-file limits
below apply to TOML files too (see :func:`parascale.bench.studyfile.load_study_file`).
"""
from __future__ import annotations

from typing import Any

import yaml

from parascale.safejson import Refused

__all__ = ["load", "vet", "MAX_BYTES", "MAX_VALUES", "MAX_DEPTH"]

MAX_BYTES = 2**20  # a study file is a few hundred bytes; this allows generated ones
MAX_VALUES = 100_000  # every scalar, list and mapping, aliases expanded (a 10,000-value sweep: 10,001)
MAX_DEPTH = 32  # a study nests 4 or 5 deep (extensions: cases: mapping: list)

_MERGE = "tag:yaml.org,2002:merge"


def load(text: str) -> Any:
    """The YAML document in ``text``, checked by :func:`vet` before it is constructed."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # the composer recurses; far deeper than MAX_DEPTH gets here
            raise Refused(f"nested more than {MAX_DEPTH} levels deep (the limit)") from None
        if node is None:
            return None
        vet(node, loader)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _no_duplicates(node: yaml.MappingNode, loader: yaml.SafeLoader) -> None:
    """Equal keys are compared as constructed (``1`` and ``0x1`` are the same key)."""
    first: dict[Any, yaml.Node] = {}
    for key, _value in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE:
            continue  # '<<' merges another mapping in; its keys may be overridden, by design
        name = loader.construct_object(key)
        if name in first:
            shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
            raise Refused(f"duplicate key {shown} at line {_line(key)} (first at line "
                          f"{_line(first[name])}); give each key once")
        first[name] = key


def vet(root: yaml.Node, loader: yaml.SafeLoader) -> None:
    """Refuse the node graph before it becomes Python objects (see the module docstring).

    An iterative depth-first walk: a node's expanded size and depth are computed once, after its
    children's, so a node reached through many aliases costs nothing more; a child that is still
    open (an ancestor) is an alias inside its own anchor.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        children = _children(node)
        if finished:
            open_.discard(id(node))
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
            # containers count, as in safejson.check_shape: [1] is one level deep
            depth[id(node)] = 0 if isinstance(node, yaml.ScalarNode) else \
                1 + max((depth[id(c)] for c in children), default=0)
            if size[id(node)] > MAX_VALUES:
                raise Refused(f"the value at line {_line(node)} expands, with its aliases, to "
                              f"more than {MAX_VALUES:,} values (the limit)")
            if depth[id(node)] > MAX_DEPTH:
                raise Refused(f"nested more than {MAX_DEPTH} levels deep at line {_line(node)} "
                              "(the limit)")
            continue
        if id(node) in size:
            continue
        if isinstance(node, yaml.MappingNode):
            _no_duplicates(node, loader)
        open_.add(id(node))
        stack.append((node, True))
        for child in children:
            if id(child) in open_:
                raise Refused(f"the anchor at line {_line(child)} is used by an alias inside "
                              "itself (a structure without end); repeat the values instead")
            if id(child) not in size:
                stack.append((child, False))
