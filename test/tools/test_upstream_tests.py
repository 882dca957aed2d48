"""tools.upstream_tests counts one file's pytest summary, and a file that outlasts --timeout is reported as timed out
rather than ending the whole run."""
import os
import sys

from tools import upstream_tests


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def test_counts_passed_and_failed(tmp_path):
    path = tmp_path / "test_counted.py"
    path.write_text("def test_ok():\n    pass\n\ndef test_bad():\n    raise NotImplementedError('x: not here')\n")
    counts, failures = upstream_tests._run(path, _env(), False, 120)
    assert counts["passed"] == 1 and counts["not implemented"] == 1 and counts["failed"] == 0
    assert len(failures) == 1


def test_timeout_is_reported_not_raised(tmp_path):
    path = tmp_path / "test_slow.py"
    path.write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    counts, failures = upstream_tests._run(path, _env(), False, 3)
    assert counts["timed out"] == 1 and counts["passed"] == 0
    assert failures and failures[0].startswith("TIMEOUT")
