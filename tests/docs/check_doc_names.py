#!/usr/bin/env python3
"""Checks that the docs call mantissa's functions by names a C++ reader can compile.

The ```cpp blocks of the docs are compiled (cmake/MantissaDocSnippets.cmake); this covers the
inline code in prose and tables. A function declared in a namespace below `mantissa` (for
example `mantissa::io::save_safetensors`) and shown as a call, `save_safetensors(path, ...)`,
does not compile where a reader pastes it: the call must carry its namespace
(`mantissa::io::save_safetensors(...)`, or `io::save_safetensors(...)` in a page that says
`using namespace mantissa`). A name after `.` or `::` is taken as qualified (a method, a Python
path, a namespace written out); a call written `mantissa::ns::name(...)` must name a function
that namespace's public headers declare.

Usage: check_doc_names.py INCLUDE_DIR DOC.md...   Prints one line per call it refuses and
a closing "N passed, N failed" line (N = documents); exits 1 when any is refused.
"""
import pathlib
import re
import sys

SKIP_LINE = re.compile(r"^(#|//|/\*|\*|}|namespace\b|class\b|struct\b|enum\b|using\b|template\b|"
                       r"friend\b|typedef\b|static_assert\b|inline constexpr\b|constexpr\b|"
                       r"extern\b|[A-Z_]+\()")
FUNCTION = re.compile(r"\b([a-z_][a-z0-9_]*)\s*\(")
NAMESPACE = re.compile(r"^namespace\s+(mantissa(?:::\w+)*)\s*\{")


def public_functions(include_dir: pathlib.Path) -> dict:
    """Free functions declared at namespace scope (column 0) in a namespace below mantissa
    (not `detail`): name -> set of namespaces."""
    found: dict = {}
    for header in sorted(include_dir.rglob("*.h")):
        namespace = None
        for line in header.read_text(encoding="utf-8").splitlines():
            opened = NAMESPACE.match(line)
            if opened:
                namespace = opened.group(1)
                continue
            if line.startswith("}  // namespace"):
                namespace = None
                continue
            if (namespace is None or namespace == "mantissa" or namespace.endswith("::detail")
                    or not line or line[0].isspace() or SKIP_LINE.match(line)):
                continue
            match = FUNCTION.search(line)
            if match:
                name = match.group(1)
                if name not in ("operator", "decltype", "sizeof"):
                    found.setdefault(name, set()).add(namespace)
    return found


def inline_spans(text: str):
    """(line number, code) of each `inline code` span outside fenced blocks."""
    in_fence = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for span in re.findall(r"`([^`]+)`", line):
            yield number, span


QUALIFIED_CALL = re.compile(r"\b(mantissa::[a-z_][a-z0-9_]*)::([a-z_][a-z0-9_]*)\s*\(")


def unqualified_calls(doc: pathlib.Path, functions: dict):
    """(line, span, message) for each call a reader could not compile as written."""
    for number, span in inline_spans(doc.read_text(encoding="utf-8")):
        for match in QUALIFIED_CALL.finditer(span):
            namespace, name = match.groups()
            if namespace != "mantissa::detail" and namespace not in functions.get(name, ()):
                yield number, span, f"calls {namespace}::{name}(), which no public header declares"
        for match in FUNCTION.finditer(span):
            name = match.group(1)
            before = span[:match.start(1)]
            if name in functions and not before.endswith(("::", ".", "->")):
                where = " or ".join(sorted(functions[name]))
                yield number, span, f"calls {name}() without its namespace ({where})"


def main(argv) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    functions = public_functions(pathlib.Path(argv[1]))
    if "save_safetensors" not in functions:  # the scan itself must keep working
        print("check_doc_names: found no mantissa::io::save_safetensors in the headers; "
              "the header scan is broken")
        return 1
    passed = failed = 0
    for path in argv[2:]:
        doc = pathlib.Path(path)
        problems = list(unqualified_calls(doc, functions))
        for number, span, message in problems:
            print(f"{doc}:{number}: `{span}` {message}")
        if problems:
            failed += 1
        else:
            passed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
