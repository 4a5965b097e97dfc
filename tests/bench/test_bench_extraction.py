"""The extraction benchmark runs at a tiny size, writes its report, and every batch size gives the
baseline's features bit for bit."""
import re

import pytest

from fedlib.bench import extraction


def test_bench_tiny(tmp_path):
    out = tmp_path / "extraction.txt"
    threads = extraction.torch.get_num_threads()
    try:
        assert extraction.main(["--images", "40", "--repeats", "1", "--out", str(out)]) == 0
    finally:
        extraction.torch.set_num_threads(threads)
    text = out.read_text()
    assert len(re.findall(r"time ratio batch \d+ / batch 256\s+[\d.]+x", text)) == 3
    assert re.search(r"time ratio batch 256 / batch 1024\s+[\d.]+x", text)
    assert text.count("equal bit for bit: passed") == 4 and "FAILED" not in text


def test_bench_refuses_zero_images():
    with pytest.raises(SystemExit):
        extraction.main(["--images", "0", "--out", "-"])
