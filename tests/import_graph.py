"""The import graph of ortllm's packages, from an AST scan of every .py file (imports at module level and inside
functions alike), shared by tests/test_layering.py and tests/test_import_cycles.py; write_tree makes the planted
trees those and tests/test_request_ownership.py check their scans on.

Module names drop the `ortllm.` prefix: runtime/engine.py is 'runtime.engine', runtime/__init__.py is 'runtime',
ortllm/__init__.py is 'ortllm'. An edge a -> b means a imports b:
    import ortllm.runtime.engine              -> runtime.engine
    from ortllm.runtime import contract       -> runtime.contract   (a submodule: the module itself)
    from ortllm.runtime import Engine         -> runtime            (a name the package's __init__ gives)
    from .protocol import LineItem            -> batch.protocol     (relative, in batch/)
Only static imports are seen: importlib.import_module(...) and __import__ are not edges.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_PACKAGES = {"tests", "ci", "build", "docs", "custom_ops"}


def packages(root: Path = REPO) -> list[str]:
    """Every top-level folder of ours that is a Python package (has an __init__.py)."""
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name not in NOT_PACKAGES
                  and (p / "__init__.py").is_file())


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """root with each file of `files` (path relative to root -> text) written: a planted tree for a source scan."""
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root


def module_of(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class Graph:
    """modules: name -> file; edges: name -> the modules of ours it imports; external: name -> the top-level
    names of the other packages it imports (flask, numpy, ...)."""

    def __init__(self, root: Path = REPO, pkgs: list[str] | None = None):
        self.root = root
        self.packages = pkgs if pkgs is not None else packages(root)
        self.modules = {module_of(f, root): f for pkg in self.packages for f in sorted((root / pkg).rglob("*.py"))}
        self.external: dict[str, set[str]] = {m: set() for m in self.modules}
        self.edges = {m: self._imports(m, f) for m, f in self.modules.items()}

    def _ours(self, dotted: str) -> str | None:
        """'ortllm.runtime.engine' / 'runtime.engine' -> 'runtime.engine' if it names a module of ours."""
        if dotted == "ortllm" or dotted.startswith("ortllm."):
            dotted = dotted[len("ortllm."):] if dotted != "ortllm" else "ortllm"
        elif dotted.split(".")[0] not in self.packages:
            return None
        return dotted if dotted in self.modules else None

    def _imports(self, name: str, path: Path) -> set[str]:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if m := self._ours(a.name):
                        out.add(m)
                    elif not a.name.startswith("ortllm"):
                        self.external[name].add(a.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[:len(package) - (node.level - 1)] + ([node.module] if node.module else []))
                    base = "ortllm." + base if base else "ortllm"
                else:
                    base = node.module or ""
                    if not self._ours(base) and not base.startswith("ortllm"):
                        self.external[name].add(base.split(".")[0])
                for a in node.names:
                    sub = self._ours(f"{base}.{a.name}")
                    target = sub or self._ours(base)
                    if target:
                        out.add(target)
        out.discard(name)
        return out

    def closure(self, start: str) -> set[str]:
        """Every module `start` reaches through imports (itself excluded unless on a cycle)."""
        return set(self.paths_from(start))

    def paths_from(self, start: str) -> dict[str, list[str]]:
        """Every module `start` reaches -> a shortest import chain to it, [start, ..., module] (BFS)."""
        paths, frontier = {}, [[start]]
        while frontier:
            nxt = []
            for chain in frontier:
                for dep in sorted(self.edges.get(chain[-1], ())):
                    if dep not in paths:
                        paths[dep] = chain + [dep]
                        nxt.append(paths[dep])
            frontier = nxt
        return paths

    def cycles(self) -> list[list[str]]:
        """One cycle (a -> ... -> a) per strongly connected component of more than one module (Tarjan)."""
        index, low, on_stack, stack, sccs = {}, {}, set(), [], []
        counter = [0]

        def visit(v):
            work = [(v, iter(sorted(self.edges[v])))]
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on_stack.add(v)
            while work:
                node, it = work[-1]
                for w in it:
                    if w not in index:
                        index[w] = low[w] = counter[0]
                        counter[0] += 1
                        stack.append(w)
                        on_stack.add(w)
                        work.append((w, iter(sorted(self.edges[w]))))
                        break
                    if w in on_stack:
                        low[node] = min(low[node], index[w])
                else:
                    work.pop()
                    if work:
                        low[work[-1][0]] = min(low[work[-1][0]], low[node])
                    if low[node] == index[node]:
                        scc = []
                        while True:
                            w = stack.pop()
                            on_stack.discard(w)
                            scc.append(w)
                            if w == node:
                                break
                        if len(scc) > 1:
                            sccs.append(sorted(scc))

        for v in sorted(self.edges):
            if v not in index:
                visit(v)
        return [self._path_through(scc) for scc in sccs]

    def _path_through(self, scc: list[str]) -> list[str]:
        """A shortest cycle from the first module of an SCC back to itself, inside the SCC (BFS)."""
        members, start = set(scc), scc[0]
        parent, frontier = {start: None}, [start]
        while frontier:
            nxt = []
            for v in frontier:
                for w in sorted(self.edges[v] & members):
                    if w == start:
                        path = [v]
                        while path[-1] != start:
                            path.append(parent[path[-1]])
                        return path[::-1] + [start]
                    if w not in parent:
                        parent[w] = v
                        nxt.append(w)
            frontier = nxt
        return scc
