"""book/code.md ("How to read the code"): every dotted fedlib name it cites exists, and the page is in
the table of contents. A failure lists every missing name, so the page can be fixed in one pass. Every
derivation chapter shows its paper's algorithm beside the equations, read from the source at build time
({literalinclude} with :pyobject:), and every object it names exists in that file."""
import ast
import importlib
import re

from fedlib.core.paths import REPO

PAGE = REPO / "book" / "code.md"


def cited_names(text: str) -> list[str]:
    """Every ``fedlib.x.y`` inside backticks, in order of first appearance."""
    names = re.findall(r"`(fedlib(?:\.\w+)+)`", text)
    return list(dict.fromkeys(names))


def resolve(name: str) -> bool:
    """Import the longest module prefix of ``name``, then look the rest up as attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is not None and module.startswith(err.name):
                continue                                   # no such module: try a shorter prefix
            return False                                   # the module exists but its imports fail
        except ImportError:
            return False
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_page_cites_names_that_exist():
    names = cited_names(PAGE.read_text())
    assert len(names) > 50
    missing = [n for n in names if not resolve(n)]
    assert not missing, "book/code.md cites names that do not exist: " + ", ".join(missing)


def test_page_covers_every_paper_and_package_and_is_in_the_toc():
    text = PAGE.read_text()
    for paper in ("afl", "stsa", "fedtsne", "refed"):
        assert f"`fedlib.{paper}." in text, paper
    for package in ("core", "data", "federated", "afl", "stsa", "fedtsne", "refed", "evaluation", "bench", "runner",
                    "flower"):
        assert f"| `fedlib.{package}` |" in text, package
    assert "file: book/code" in (REPO / "_toc.yml").read_text()


def test_resolve_rejects_missing_names():
    assert resolve("fedlib.core.seeds.derive_seed") and resolve("fedlib.afl.tables")
    assert not resolve("fedlib.core.seeds.no_such_function") and not resolve("fedlib.no_such_module")


def test_every_book_page_cites_names_that_exist():
    """The other prose pages (performance pages, how to reproduce) name fedlib code too."""
    missing = [f"{page.name}: {n}" for page in sorted((REPO / "book").glob("*.md")) if page != PAGE
               for n in cited_names(page.read_text()) if not resolve(n)]
    assert not missing, "book pages cite names that do not exist: " + ", ".join(missing)


DERIVATIONS = {"afl_derivation": "afl", "stsa_derivation": "stsa", "fedtsne_derivation": "fedtsne",
               "refed_theory": "refed"}
INCLUDE = re.compile(r"^# ```\{literalinclude\} /(\S+)\n# :pyobject: (\S+)\n", re.M)


def shown_source(chapter: str) -> list[tuple[str, str]]:
    """(file, object) of every ``{literalinclude}`` with ``:pyobject:`` in notebooks/CHAPTER.py."""
    return INCLUDE.findall((REPO / "notebooks" / f"{chapter}.py").read_text())


def defined_objects(path) -> set[str]:
    """Top-level functions and classes of a Python file, and ``Class.method`` for their methods."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {f"{node.name}.{m.name}" for m in node.body if isinstance(m, ast.FunctionDef)}
    return names


def test_every_derivation_chapter_shows_its_algorithm_from_the_source():
    for chapter, paper in DERIVATIONS.items():
        shown = shown_source(chapter)
        algorithm = f"fedlib/{paper}/algorithm.py"
        assert sum(f == algorithm for f, _ in shown) >= 3, f"{chapter} shows fewer than 3 objects of {algorithm}"
        for file, obj in shown:
            assert file.startswith(f"fedlib/{paper}/") and (REPO / file).is_file(), (chapter, file)
            assert obj in defined_objects(REPO / file), f"{chapter}: {file} defines no {obj}"


def test_defined_objects_finds_functions_classes_and_methods(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    pass\n\n\nclass A:\n    def g(self):\n        pass\n")
    assert defined_objects(path) == {"f", "A", "A.g"}
    assert ("fedlib/afl/algorithm.py", "client_update") in shown_source("afl_derivation")
