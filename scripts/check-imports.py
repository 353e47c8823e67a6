#!/usr/bin/env python3
"""Find import circles between the files of the muster library (src/**/*.rs).

What it checks
--------------
Every file of the library crate is one node: `src/lib.rs` is the crate root, `src/a/b.rs` and
`src/a/b/mod.rs` are the module `a::b`. A file depends on another when it names it by a path:

  * `use` declarations (also `pub use`, grouped trees such as `use crate::{a::b, c::{d, e}}` over
    several lines, `self` in a group, `as` renames, globs);
  * paths written in code without a `use`, such as `crate::hang::progress::Hooks::new()`;
  * paths that start with `crate`, `$crate` (inside `macro_rules!`), `super`, `self`, a child module
    of the current module (2018 "uniform paths": `pub use entrypoint::Entrypoint;` in config/mod.rs),
    a child module of a module glob-imported with `use P::*`, or a name this file bound to a
    module or item by a `use` (so `use crate::store;` followed by `store::tcp::Server` in code is an
    edge to store/tcp/server.rs as well as to store/mod.rs).

A path resolves to the longest module prefix that is a file: `crate::agent::state::Cause` is
agent/state.rs, `super::AgentError` in agent/state.rs is agent/mod.rs. A path in code followed by `(`
or `!` ends in a function or macro, so its last segment is not taken as a module:
`crate::context::fill(cli, &c)` calls the function that context/mod.rs re-exports (edge to
context/mod.rs), not the private module context/fill.rs. Re-exports are not followed:
`use crate::store::RdzvStore` is an edge to store/mod.rs, wherever `RdzvStore` is defined. A path to
a `#[macro_export]` macro (`crate::errln!`, `use crate::errln`) is an edge to the file that defines
the macro. An edge from a module to its parent (`use super::X` of an item in mod.rs) is an edge; a
parent's `mod child;` does not (declaring a child is not an import). By default an edge from a module to one of
its own ancestors (`use super::AgentError`, `use crate::store::StoreError` in store/tcp/client.rs) is
left out: using what an enclosing module defines or re-exports is nesting, not a circle
(`--with-ancestors` counts it). Edges of a file to itself are
dropped, and so is a visibility such as `pub(in crate::store::tcp)`. src/main.rs (the binary, a
separate crate that uses the library as `muster::`) and src/bin/ are not part of the graph.

It reports every strongly connected component with more than one file (Tarjan), with, for each edge
inside it, one place that makes it (a `use` where there is one, else an inline path).

Approximations (it reads text, it is not a compiler)
----------------------------------------------------
  * Comments, doc comments, string and char literals are blanked out before anything is read.
  * Test code is skipped: files named tests.rs, *_tests.rs, fuzz.rs, any file declared by
    `#[cfg(test)] mod x;` (e.g. store/etcd/testing.rs), and everything below such a file; and in
    other files the item after a `#[cfg(test)]` attribute (a `mod tests { ... }` block, a function,
    a `use`), found by a plain brace/bracket-depth skip to the end of that item.
  * Names bound by `use` are treated as visible in the whole file, whatever block the `use` is in;
    a local item or variable that shadows such a name is not seen.
  * A bare first segment that is neither a child module nor a `use`-bound name is taken to be an
    external crate, a local item or a prelude name, and ignored.
  * `#[path = "..."]` attributes are not followed (the script warns if it sees one).

How to run
----------
  scripts/check-imports.py                      # report circles; exit 1 if any, 0 if none
  scripts/check-imports.py --deps agent::state  # the files one module's file depends on
  scripts/check-imports.py --check-no-dep observe agent
        # exit 1 if any file under `observe` depends on any file under `agent`
  --src DIR  reads another source tree (default: src/ next to this script's directory).
Module names are written `a::b` (`crate` for the root); a file path like src/a/b.rs works too.
Exit status 2 means bad usage.
"""

import argparse
import os
import re
import sys

TEST_FILE_NAMES = ("tests.rs", "fuzz.rs")


# ---------------------------------------------------------------------------------------------------
# Lexing


def blank(src):
    """Return src with comments and the insides of string/char literals replaced by spaces.

    Newlines are kept, so line numbers still match.
    """
    out = []
    i, n = 0, len(src)

    def keep_newlines(s):
        return "".join(c if c == "\n" else " " for c in s)

    def ident_char(c):
        return c.isalnum() or c == "_"

    while i < n:
        c = src[i]
        if c == "/" and src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_newlines(src[i:j]))
            i = j
        elif c in "rbc" and (i == 0 or not ident_char(src[i - 1])) and re.match(r'(?:r|br|cr)#*"', src[i:i + 300]):
            # raw string: r"..." r#"..."# br"..." cr"..."
            m = re.match(r'(?:r|br|cr)(#*)"', src[i:])
            close = '"' + m.group(1)
            start = i + m.end()
            j = src.find(close, start)
            j = n if j < 0 else j + len(close)
            out.append(" " * m.end() + keep_newlines(src[start:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(keep_newlines(src[i:j]))
            i = j
        elif c == "'":
            # char literal ('a', '\n', '\u{1F600}', b'x') or a lifetime/label ('a, 'static)
            if i + 1 < n and src[i + 1] == "\\":
                j = src.find("'", i + 2)
                j = n if j < 0 else j + 1
                out.append(" " * (j - i))
                i = j
            elif i + 2 < n and src[i + 2] == "'" and src[i + 1] != "\n":
                out.append("   ")
                i += 3
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


TOKEN_RE = re.compile(r"r#[A-Za-z_]\w*|[A-Za-z_]\w*|::|\S")


def tokenize(clean):
    """List of (text, line) tokens; raw identifiers lose their r#."""
    toks = []
    line = 1
    pos = 0
    for m in TOKEN_RE.finditer(clean):
        line += clean.count("\n", pos, m.start())
        pos = m.start()
        t = m.group(0)
        if t.startswith("r#"):
            t = t[2:]
        toks.append((t, line))
    return toks


def is_ident(t):
    return bool(t) and (t[0].isalpha() or t[0] == "_")


# ---------------------------------------------------------------------------------------------------
# Parsing one file


class Ref:
    """A path this file names: segments as written, the module it is written in, where, and how."""

    __slots__ = ("segs", "scope", "line", "kind", "text", "value")

    def __init__(self, segs, scope, line, kind):
        self.value = False
        self.segs = segs
        self.scope = scope
        self.line = line
        self.kind = kind  # "use" or "path"
        self.text = "::".join(segs)


class FileInfo:
    def __init__(self, rel, module):
        self.rel = rel  # e.g. src/agent/state.rs
        self.module = module  # tuple, () for the crate root
        self.test_only = False
        self.children = {}  # name -> test_only (from `mod name;`)
        self.inline_mods = set()  # module tuples of inline `mod x { }` blocks (not test)
        self.refs = []
        self.bindings = []  # (scope, name, segs, line) from `use`
        self.globs = []  # (scope, segs) from `use ...::*`
        self.macros = set()  # #[macro_export] macro_rules! names
        self.path_attr_lines = []


def parse_attr(toks, i):
    """toks[i] is '#'. Return (index after the attribute, is_inner, is_test_cfg)."""
    j = i + 1
    inner = False
    if j < len(toks) and toks[j][0] == "!":
        inner = True
        j += 1
    if j >= len(toks) or toks[j][0] != "[":
        return i + 1, False, False
    depth = 0
    body = []
    while j < len(toks):
        t = toks[j][0]
        if t == "[":
            depth += 1
        elif t == "]":
            depth -= 1
            if depth == 0:
                j += 1
                break
        body.append(t)
        j += 1
    body = body[1:]  # drop the opening '['
    s = "".join(body)
    test = s == "cfg(test)" or (s.startswith("cfg(all(") and re.search(r"[(,]test[,)]", s) is not None)
    return j, inner, test


def skip_attrs(toks, k):
    """The index of the first token at or after k that does not belong to an attribute."""
    n = len(toks)
    while k < n and toks[k][0] == "#":
        k2, _, _ = parse_attr(toks, k)
        if k2 == k + 1:
            break
        k = k2
    return k


def skip_item(toks, i):
    """Skip the item (or statement, field, arm) starting at toks[i]; return the index after it."""
    n = len(toks)
    # further attributes on the same item
    while i < n and toks[i][0] == "#":
        j, _, _ = parse_attr(toks, i)
        if j == i + 1:
            break
        i = j
    depth = 0
    while i < n:
        t = toks[i][0]
        if t in "([{":
            depth += 1
        elif t in ")]}":
            if depth == 0:
                return i  # closer of the enclosing block: the item ended before it
            depth -= 1
            if depth == 0 and t == "}":
                return i + 1
        elif t in ";," and depth == 0:
            return i + 1
        i += 1
    return i


def parse_use_tree(toks, i, prefix, scope, info, out):
    """Parse one use tree at toks[i] under prefix; append Refs to out, bindings to info."""
    n = len(toks)
    segs = list(prefix)
    if i < n and toks[i][0] == "::":
        if not segs:
            segs.append("::")  # `use ::ext::...`: an external crate
        i += 1
    line = toks[i][1] if i < n else 0
    while i < n:
        t, line = toks[i]
        if t == "{":
            i += 1
            while i < n and toks[i][0] != "}":
                before = i
                i = parse_use_tree(toks, i, segs, scope, info, out)
                if i < n and toks[i][0] == ",":
                    i += 1
                if i == before:
                    i += 1
            return i + 1
        if t == "*":
            out.append(Ref(segs, scope, line, "use"))
            info.globs.append((scope, segs))
            return i + 1
        if is_ident(t):
            segs.append(t)
            i += 1
            if i < n and toks[i][0] == "::":
                i += 1
                continue
            name = segs[-1]
            if name == "self" and len(segs) > 1:
                segs = segs[:-1]
                name = segs[-1]
            if i < n and toks[i][0] == "as" and i + 1 < n:
                name = toks[i + 1][0]
                i += 2
            out.append(Ref(segs, scope, line, "use"))
            if name != "_" and name not in ("crate", "super", "self", "::"):
                info.bindings.append((scope, name, segs, line))
            return i
        return i
    return i


def parse_file(info, src):
    clean = blank(src)
    for m in re.finditer(r"#\s*\[\s*path\s*=", clean):
        info.path_attr_lines.append(clean.count("\n", 0, m.start()) + 1)
    toks = tokenize(clean)
    n = len(toks)
    depth = 0
    inline = []  # stack of (name, brace depth inside the block)
    pending_mod = None  # name of `mod x` whose `{` comes next
    i = 0

    def scope():
        return info.module + tuple(name for name, _ in inline)

    while i < n:
        t, line = toks[i]
        prev = toks[i - 1][0] if i else ""
        if t == "#":
            j, inner, test = parse_attr(toks, i)
            if j == i + 1:
                i += 1
                continue
            if test and inner and depth == 0 and not inline:
                info.test_only = True
                return
            if test and not inner:
                # `#[cfg(test)] mod x;` declares a test-only child file
                k = skip_attrs(toks, j)
                if k < n and toks[k][0] == "pub":
                    k += 1
                    if k < n and toks[k][0] == "(":
                        while k < n and toks[k][0] != ")":
                            k += 1
                        k += 1
                if k + 2 < n and toks[k][0] == "mod" and is_ident(toks[k + 1][0]) and toks[k + 2][0] == ";":
                    if not inline:
                        info.children[toks[k + 1][0]] = True
                i = skip_item(toks, j)
                continue
            if not inner:
                # macro_export: remember the macro's name
                body = "".join(x for x, _ in toks[i:j])
                if body == "#[macro_export]":
                    k = skip_attrs(toks, j)
                    if k + 2 < n and toks[k][0] == "macro_rules" and toks[k + 1][0] == "!":
                        info.macros.add(toks[k + 2][0])
            i = j
            continue
        if t == "{":
            depth += 1
            if pending_mod is not None:
                inline.append((pending_mod, depth))
                info.inline_mods.add(scope())
                pending_mod = None
            i += 1
            continue
        if t == "}":
            if inline and inline[-1][1] == depth:
                inline.pop()
            depth -= 1
            i += 1
            continue
        if t == "mod" and i + 2 < n and is_ident(toks[i + 1][0]):
            if toks[i + 2][0] == ";":
                if not inline:
                    info.children.setdefault(toks[i + 1][0], False)
                i += 3
                continue
            if toks[i + 2][0] == "{":
                pending_mod = toks[i + 1][0]
                i += 2
                continue
        if t == "pub" and i + 2 < n and toks[i + 1][0] == "(" and toks[i + 2][0] == "in":
            # pub(in crate::x): a visibility, not a use of x
            while i < n and toks[i][0] != ")":
                i += 1
            i += 1
            continue
        if t == "use" and prev != "::":
            i = parse_use_tree(toks, i + 1, [], scope(), info, info.refs)
            while i < n and toks[i][0] != ";":
                i += 1
            i += 1
            continue
        if is_ident(t) and prev not in ("::", ".") and i + 2 < n and toks[i + 1][0] == "::" and is_ident(toks[i + 2][0]):
            segs = ["crate" if (t == "crate" and prev == "$") else t]
            k = i + 1
            while k + 1 < n and toks[k][0] == "::" and is_ident(toks[k + 1][0]):
                segs.append(toks[k + 1][0])
                k += 2
            ref = Ref(segs, scope(), line, "path")
            # `crate::context::fill(..)`, `crate::errln!(..)`: the last segment is a function or a
            # macro (value/macro namespace), never a module, even where a module has that name
            ref.value = k < n and toks[k][0] in ("(", "!")
            info.refs.append(ref)
            i = k
            continue
        i += 1


# ---------------------------------------------------------------------------------------------------
# The crate


def module_of(rel_in_src):
    parts = rel_in_src[:-3].split("/")  # drop .rs
    if parts == ["lib"]:
        return ()
    if parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(parts)


def fmt_mod(m):
    return "::".join(m) if m else "crate"


class Crate:
    def __init__(self, src_dir, ancestors=False):
        self.src_dir = src_dir
        self.base = os.path.dirname(os.path.abspath(src_dir))
        self.files = {}  # module tuple -> FileInfo (library files, tests included for now)
        self.warnings = []
        for root, dirs, names in os.walk(src_dir):
            dirs.sort()
            for name in sorted(names):
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(root, name)
                rel_in_src = os.path.relpath(path, src_dir).replace(os.sep, "/")
                if rel_in_src == "main.rs" or rel_in_src.startswith("bin/"):
                    continue
                rel = os.path.relpath(path, self.base).replace(os.sep, "/")
                info = FileInfo(rel, module_of(rel_in_src))
                with open(path, encoding="utf-8") as f:
                    parse_file(info, f.read())
                if name in TEST_FILE_NAMES or name.endswith("_tests.rs"):
                    info.test_only = True
                for ln in info.path_attr_lines:
                    self.warnings.append("%s:%d: #[path] attribute is not followed" % (rel, ln))
                self.files[info.module] = info
        # test-only propagates: a file declared by `#[cfg(test)] mod x;`, and everything below a test file
        for m, info in self.files.items():
            for child, test in info.children.items():
                if test and m + (child,) in self.files:
                    self.files[m + (child,)].test_only = True
        for m in sorted(self.files, key=len):
            if any(m[:k] in self.files and self.files[m[:k]].test_only for k in range(1, len(m))):
                self.files[m].test_only = True
        self.modules = {}  # every module tuple (files and inline blocks) -> the file it lives in
        self.macros = {}
        for m, info in self.files.items():
            self.modules[m] = m
            for im in info.inline_mods:
                self.modules[im] = m
            for name in info.macros:
                self.macros[name] = m
        self.edges = {}  # from file module -> {to file module: [(line, kind, text)]}
        for m, info in self.files.items():
            if info.test_only:
                continue
            out = self.edges.setdefault(m, {})
            for ref in info.refs:
                target = self.resolve(info, ref.segs, ref.scope, ref.value)
                if target is None or target == m:
                    continue
                # A module may use what its ancestors define or re-export (an error type, a helper):
                # that is nesting, not a circle, unless --with-ancestors asks for every edge.
                if not ancestors and m[:len(target)] == target:
                    continue
                if self.files[target].test_only:
                    continue
                out.setdefault(target, []).append((ref.line, ref.kind, ref.text))

    def children_of(self, mod):
        return {k[-1] for k in self.modules if len(k) == len(mod) + 1 and k[:-1] == mod}

    def absolute(self, info, segs, scope, seen=0):
        """The absolute path (tuple) that segs names in scope, or None if it is not in this crate."""
        if not segs or seen > 8:
            return None
        first = segs[0]
        if first == "::":
            return None
        if first == "crate":
            return tuple(segs[1:])
        if first in ("self", "super"):
            base = list(scope)
            k = 0
            while k < len(segs) and segs[k] in ("self", "super"):
                if segs[k] == "super":
                    if not base:
                        return None
                    base.pop()
                k += 1
            return tuple(base) + tuple(segs[k:])
        # a child module of the scope (or of an enclosing inline module's file scope)
        if first in self.children_of(scope):
            return tuple(scope) + tuple(segs)
        # a name bound by `use` in this file (the innermost scope that binds it)
        best = None
        for bscope, name, bsegs, _ in info.bindings:
            if name == first and scope[:len(bscope)] == bscope and (best is None or len(bscope) > len(best[0])):
                best = (bscope, bsegs)
        if best is not None and best[1] is not segs:
            target = self.absolute(info, best[1], best[0], seen + 1)
            if target is not None:
                return target + tuple(segs[1:])
            return None
        # a child module of a glob-imported module
        for gscope, gsegs in info.globs:
            if scope[:len(gscope)] != gscope:
                continue
            gmod = self.absolute(info, gsegs, gscope, seen + 1)
            if gmod is not None and gmod in self.modules and first in self.children_of(gmod):
                return gmod + tuple(segs)
        return None

    def resolve(self, info, segs, scope, value=False):
        """The file (module tuple) that a path resolves to, or None.

        value: the path names a function or macro (it is followed by `(` or `!`), so its last
        segment is not a module.
        """
        path = self.absolute(info, segs, scope)
        if path is None:
            return None
        if value and path and path[0] in self.macros and len(path) == 1:
            return self.macros[path[0]]
        for k in range(len(path) - (1 if value else 0), 0, -1):
            if path[:k] in self.modules:
                return self.modules[path[:k]]
        if path and path[0] in self.macros:
            return self.macros[path[0]]
        return ()

    # -----------------------------------------------------------------------------------------------

    def loc(self, frm, to):
        """One place that makes the edge frm -> to: a `use` if there is one."""
        places = self.edges[frm][to]
        uses = [p for p in places if p[1] == "use"]
        line, kind, text = (uses or places)[0]
        what = "use %s" % text if kind == "use" else "path %s" % text
        return "%s:%d (%s)" % (self.files[frm].rel, line, what)

    def sccs(self):
        """Tarjan's algorithm (iterative); components in a stable order."""
        index = {}
        low = {}
        on_stack = set()
        stack = []
        result = []
        counter = [0]
        nodes = sorted(self.edges)
        for root in nodes:
            if root in index:
                continue
            work = [(root, iter(sorted(self.edges.get(root, {}))))]
            index[root] = low[root] = counter[0]
            counter[0] += 1
            stack.append(root)
            on_stack.add(root)
            while work:
                v, it = work[-1]
                advanced = False
                for w in it:
                    if w not in self.edges:
                        continue
                    if w not in index:
                        index[w] = low[w] = counter[0]
                        counter[0] += 1
                        stack.append(w)
                        on_stack.add(w)
                        work.append((w, iter(sorted(self.edges.get(w, {})))))
                        advanced = True
                        break
                    if w in on_stack:
                        low[v] = min(low[v], index[w])
                if advanced:
                    continue
                work.pop()
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    result.append(sorted(comp))
        return sorted((c for c in result if len(c) > 1), key=lambda c: self.files[c[0]].rel)

    def lookup(self, name):
        """A module name (a::b, crate) or a file path -> module tuple."""
        if name.endswith(".rs"):
            for m, info in self.files.items():
                if info.rel == name or os.path.abspath(os.path.join(self.base, info.rel)) == os.path.abspath(name):
                    return m
            return None
        if name in ("crate", "", "lib"):
            return ()
        m = tuple(x for x in name.replace("crate::", "", 1).split("::") if x)
        return m if m in self.files else None


def under(m, top):
    return m[:len(top)] == top


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        description="Find import circles between the files of src/ (see the docstring for the rules).")
    ap.add_argument("--src", default=os.path.join(os.path.dirname(here), "src"), help="source directory (default: ../src)")
    ap.add_argument("--deps", metavar="MODULE", help="print the files MODULE's file depends on, with where")
    ap.add_argument("--check-no-dep", nargs=2, metavar=("FROM", "TO"),
                    help="exit 1 if any file under module FROM depends on any file under module TO")
    ap.add_argument("--with-ancestors", action="store_true",
                    help="also count a module's edges to its own ancestors (use super::X of an item in mod.rs)")
    args = ap.parse_args(argv)

    if not os.path.isdir(args.src):
        print("check-imports: no source directory %s" % args.src, file=sys.stderr)
        return 2
    crate = Crate(args.src, args.with_ancestors)
    for w in crate.warnings:
        print("warning: " + w, file=sys.stderr)

    if args.deps:
        m = crate.lookup(args.deps)
        if m is None:
            print("check-imports: no module %s" % args.deps, file=sys.stderr)
            return 2
        info = crate.files[m]
        if info.test_only:
            print("%s (%s) is test-only; it is not in the graph" % (fmt_mod(m), info.rel))
            return 0
        deps = crate.edges.get(m, {})
        print("%s (%s) depends on %d file(s):" % (fmt_mod(m), info.rel, len(deps)))
        for to in sorted(deps, key=lambda t: crate.files[t].rel):
            lines = sorted({p[0] for p in deps[to]})
            print("  %-36s %s  [lines %s]" % (crate.files[to].rel, crate.loc(m, to), ", ".join(map(str, lines))))
        return 0

    if args.check_no_dep:
        frm_name, to_name = args.check_no_dep
        frm, to = crate.lookup(frm_name), crate.lookup(to_name)
        for name, m in ((frm_name, frm), (to_name, to)):
            if m is None:
                print("check-imports: no module %s" % name, file=sys.stderr)
                return 2
        bad = []
        for a in sorted(crate.edges, key=lambda x: crate.files[x].rel):
            if not under(a, frm):
                continue
            for b in sorted(crate.edges[a], key=lambda x: crate.files[x].rel):
                if under(b, to) and not under(b, frm):
                    bad.append((a, b))
        if not bad:
            print("ok: nothing under %s depends on anything under %s" % (fmt_mod(frm), fmt_mod(to)))
            return 0
        print("%d dependencies of %s on %s:" % (len(bad), fmt_mod(frm), fmt_mod(to)))
        for a, b in bad:
            print("  %s -> %s  %s" % (crate.files[a].rel, crate.files[b].rel, crate.loc(a, b)))
        return 1

    comps = crate.sccs()
    nfiles = sum(1 for i in crate.files.values() if not i.test_only)
    nedges = sum(len(v) for v in crate.edges.values())
    if not comps:
        print("no import circles (%d files, %d edges)" % (nfiles, nedges))
        return 0
    print("%d import circle(s) among %d files (%d edges):" % (len(comps), nfiles, nedges))
    for k, comp in enumerate(comps, 1):
        members = set(comp)
        print()
        print("circle %d: %d files" % (k, len(comp)))
        for m in sorted(comp, key=lambda x: crate.files[x].rel):
            print("  %s" % crate.files[m].rel)
        print("  edges:")
        for a in sorted(comp, key=lambda x: crate.files[x].rel):
            for b in sorted(crate.edges[a], key=lambda x: crate.files[x].rel):
                if b in members:
                    print("    %s -> %s  %s" % (crate.files[a].rel, crate.files[b].rel, crate.loc(a, b)))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
