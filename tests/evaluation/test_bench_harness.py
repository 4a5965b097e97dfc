"""The shared benchmark harness (fedlib.evaluation.benchmark): options, timing, ratio table, report file."""
import pytest

from fedlib.evaluation import benchmark as bench
from fedlib.core.paths import BENCHMARK_DIR


def test_parser_common_options_and_default_out():
    p = bench.parser("Title line.\n\nMore.", "demo")
    args = p.parse_args([])
    assert args.out == str(BENCHMARK_DIR / "demo.txt") and args.seed == 0 and args.repeats == 3
    assert p.description == "Title line."
    args = bench.parser("x", "demo", repeats=None, seed=None).parse_args(["--out", "-"])
    assert args.out == "-" and not hasattr(args, "seed") and not hasattr(args, "repeats")


def test_require_positive_names_the_option(capsys):
    p = bench.parser("x", "demo")
    p.add_argument("--loop-points", type=int, default=1)
    with pytest.raises(SystemExit):
        bench.require_positive(p, p.parse_args(["--loop-points", "0"]), "loop_points")
    assert "--loop-points must be >= 1" in capsys.readouterr().err


def test_measure_warms_up_interleaves_and_keeps_last_output():
    calls = []
    t = bench.measure({"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}, repeats=2)
    assert calls == ["a", "b"] * 3                       # one warm-up round, then two interleaved rounds
    assert len(t["a"].times) == 2 and t["b"].out == 2 and t["a"].best <= t["a"].median
    with pytest.raises(ValueError, match="repeats"):
        bench.measure({"a": lambda: 0}, repeats=0)


def test_ratio_rows_against_the_baseline():
    rows = bench.ratio_rows({"(a)": 2.0, "(b)": 5.0, "(c)": 1.0}, "(a)", width=24, note="n")
    assert rows == ["  time ratio (b) / (a)    2.5x  n", "  time ratio (c) / (a)    0.5x  n"]
    with pytest.raises(ValueError, match="baseline"):
        bench.ratio_rows({"(a)": 1.0}, "(z)")


def test_write_report_prints_and_writes(tmp_path, capsys):
    out = tmp_path / "sub" / "r.txt"
    bench.write_report("hello", out)
    assert out.read_text() == "hello\n" and "hello" in capsys.readouterr().out
    bench.write_report("only printed", "-")
    assert not (tmp_path / "-").exists()
    assert bench.machine(device="cpu").startswith("machine: ") and bench.peak_memory_gib() > 0


def test_check_row_and_finish(tmp_path, capsys):
    assert bench.check_row("diff", 1e-12, 1e-10, "max", 8) == "  diff    1.00e-12  (max; check < 1e-10: passed)"
    assert bench.check_row("diff", 1.0, 1e-10, "max").endswith("check < 1e-10: FAILED)")
    out = tmp_path / "r.txt"
    assert bench.finish(["a"], out) == 0 and bench.finish(["a"], out, ok=False) == 1
    text = out.read_text()
    assert text.startswith("a\n  peak resident memory") and text.endswith("GiB\n")


def test_afl_aggregation_tiny_report(tmp_path):
    from fedlib.afl import bench as afl_aggregation

    out = tmp_path / "afl.txt"
    assert afl_aggregation.main(["--clients", "3", "--dim", "12", "--per-client", "5", "--samples", "40",
                                 "--repeats", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("machine: ") and "K=3 clients, d=12" in text and "best of 1" in text
    assert "time ratio pairwise / one-solve" in text and "peak resident memory" in text
    assert "arithmetic: C_k W_k by BLAS" in text and "time ratio server packed / arithmetic" in text
    assert "time ratio server C+B / floor packed" in text and "upload per client, packed C + B" in text
    assert "its upload check alone (packed C + B)" in text and "time ratio check C+B / floor packed" in text
    assert "FAILED" not in text          # every agreement check, the statistics upload's included
    diff = float(text.split("max |W_pairwise - W_one_solve|")[1].split()[0])
    assert diff < 1e-8


def test_afl_aggregation_rejects_bad_options():
    from fedlib.afl import bench as afl_aggregation

    with pytest.raises(SystemExit):
        afl_aggregation.main(["--clients", "0", "--out", "-"])


def test_book_time_compares_recorded_durations_with_the_baseline(tmp_path, monkeypatch, capsys):
    import json

    from fedlib.bench import book_time

    def notebook(seconds, profile):
        cells = [{"cell_type": "code", "source": "slow()", "metadata": {"papermill": {"duration": seconds - 1}}}]
        return {"cells": cells, "metadata": {"papermill": {"duration": seconds, "parameters": {"profile": profile}}}}

    monkeypatch.setattr(book_time, "EXECUTED_DIR", tmp_path)
    monkeypatch.setattr(book_time, "notebook_names", lambda: ["a", "b", "c"])
    (tmp_path / "a.ipynb").write_text(json.dumps(notebook(30.0, "quick")))
    (tmp_path / "b.ipynb").write_text(json.dumps(notebook(5.0, "smoke")))      # another profile: not compared
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"what": "old run", "chapters": {"a": {"seconds": 120.0, "profile": "quick"},
                                                                "b": {"seconds": 9.0, "profile": "quick"}}}))
    assert book_time.main(["--baseline", str(base), "--out", "-"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "baseline: old run"
    assert out[3].split()[:4] == ["a", "120", "30", "0.25x"] and "slow()" in out[3]
    assert "not comparable" in out[4] and "not comparable" in out[5]
    saved = tmp_path / "new.json"
    assert book_time.main(["--save-baseline", str(saved)]) == 0
    assert json.loads(saved.read_text())["chapters"] == {"a": {"seconds": 30.0, "profile": "quick"},
                                                         "b": {"seconds": 5.0, "profile": "smoke"}}


def test_book_time_alone_runs_each_chapter_and_reports_it_against_the_baseline(tmp_path, monkeypatch, capsys):
    """--alone: every named chapter is run (here a stand-in for the runner), its recorded duration compared
    with the baseline, its end-to-end time with the 3-minute goal; unknown chapters and profiles are refused
    before any run."""
    import json

    from fedlib.bench import book_time

    ran = []

    def fake_run(name, profile, out):
        ran.append((name, profile))
        out.write_text(json.dumps({"cells": [], "metadata": {"papermill": {
            "duration": {"a": 60.0, "b": 170.0}[name], "parameters": {"profile": profile}}}}))
        return {"a": 64.0, "b": 190.0}[name], 100.0

    monkeypatch.setattr(book_time, "run_chapter", fake_run)
    monkeypatch.setattr(book_time, "notebook_names", lambda: ["a", "b", "c"])
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"what": "old run", "chapters": {"a": {"seconds": 120.0, "profile": "quick"}}}))
    assert book_time.main(["--alone", "a", "b", "--baseline", str(base), "--out", "-"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert ran == [("a", "quick"), ("b", "quick")]
    assert out[2].startswith("machine speed") and out[2].count(" ms") == 2
    assert out[4].split() == ["a", "120", "60", "0.50x", "64", "100", "yes"]
    assert out[5].split() == ["b", "-", "170", "-", "190", "100", "NO"]      # no baseline; above 180 s
    # another profile: no baseline of that profile, and the 3-minute goal (a quick-profile goal) is not shown
    assert book_time.main(["--alone", "b", "--profile", "paper", "--baseline", str(base), "--out", "-"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[3].split()[-1] == "s" and out[4].split() == ["b", "-", "170", "-", "190", "100"]
    ran.clear()
    for bad in (["--alone", "zz"], ["--alone", "a", "--profile", "huge"]):
        with pytest.raises(SystemExit):
            book_time.main([*bad, "--baseline", str(base), "--out", "-"])
    assert not ran
    # without --out the report goes to chapters_alone_PROFILE.txt, never over the book's book_time.txt
    monkeypatch.setattr(book_time, "BENCHMARK_DIR", tmp_path)
    monkeypatch.setattr(book_time.bench, "default_out", lambda name: tmp_path / f"{name}.txt")
    assert book_time.main(["--alone", "a", "--baseline", str(base)]) == 0
    assert (tmp_path / "chapters_alone_quick.txt").read_text().splitlines()[4].split()[0] == "a"
    assert not (tmp_path / "book_time.txt").exists()


def test_read_rows_gives_back_what_row_wrote(tmp_path):
    from fedlib.evaluation.benchmark import leading_number, read_rows, row
    path = tmp_path / "r.txt"
    path.write_text("\n".join(["machine: x", row("CA 10-NN Fed-tSNE", "0.7745  (ratio 0.923)"),
                               "      indented detail", row("time ratio", "2.28x")]) + "\n")
    rows = read_rows(path)
    assert rows == {"CA 10-NN Fed-tSNE": "0.7745  (ratio 0.923)", "time ratio": "2.28x"}
    assert leading_number(rows["CA 10-NN Fed-tSNE"]) == 0.7745 and leading_number(rows["time ratio"]) == 2.28


def test_the_committed_scale_report_has_the_rows_the_benchmark_chapter_cites():
    from fedlib.core.paths import BENCHMARK_DIR
    from fedlib.evaluation.benchmark import leading_number, read_rows
    rows = read_rows(BENCHMARK_DIR / "fedtsne_scale.txt")
    for label in ("CA 10-NN centralized", "CA 10-NN Fed-tSNE", "CA 10-NN best route"):
        assert 0 < leading_number(rows[label]) <= 1, label
