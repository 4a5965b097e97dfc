"""book/code.md ("How to read the code"): every dotted fedlib name it cites exists, and the page is in
the table of contents. A failure lists every missing name, so the page can be fixed in one pass."""
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
