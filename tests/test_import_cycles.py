"""No import cycle between ortllm's modules, lazy (function-level) imports included.

A lazy import inside a function hides a cycle from Python's import machinery but not from a reader: the two
modules still need each other. The fix is to move what both sides need into a module both import (see
docs/architecture.md, "Dependency rules"). The graph is an AST scan of every .py file (tests/import_graph.py).
"""
from __future__ import annotations

from tests.import_graph import Graph, write_tree


def test_no_import_cycles():
    cycles = Graph().cycles()
    assert cycles == [], "import cycles (lazy imports count): " + "; ".join(" -> ".join(c) for c in cycles)


def test_a_planted_lazy_cycle_is_caught(tmp_path):
    """Two packages whose modules import each other, one side only inside a function, and a three-module
    cycle through a relative import and a package __init__: both are found, with their path."""
    root = write_tree(tmp_path, {
        "alpha/__init__.py": "",
        "alpha/a.py": "from ortllm.beta.b import thing\n",
        "beta/__init__.py": "from .c import C\n",
        "beta/b.py": "def thing():\n    from ortllm.alpha import a\n    return a\n",
        "beta/c.py": "import ortllm.beta.d\nC = 1\n",
        "beta/d.py": "def f():\n    from ortllm.beta import C\n    return C\n",
        "beta/e.py": "from . import c\n",               # a submodule import, not the package: no cycle
    })
    g = Graph(root)
    assert g.packages == ["alpha", "beta"]
    cycles = sorted(g.cycles())
    assert cycles == [["alpha.a", "beta.b", "alpha.a"], ["beta", "beta.c", "beta.d", "beta"]], cycles
    assert g.edges["beta.e"] == {"beta.c"}


def test_an_acyclic_tree_has_no_cycles(tmp_path):
    root = write_tree(tmp_path, {
        "alpha/__init__.py": "",
        "alpha/a.py": "import os\nfrom ortllm.beta import b\n\ndef f():\n    from ortllm.beta.b import thing\n",
        "beta/__init__.py": "",
        "beta/b.py": "import numpy\nthing = 1\n",
    })
    g = Graph(root)
    assert g.cycles() == [] and g.edges["alpha.a"] == {"beta.b"}
