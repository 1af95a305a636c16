"""CI cannot pass by accident (tests/conftest.py): under ``CI=true`` a test that skips, a module
skipped while it is collected and a test marked ``xfail`` each fail, naming why; outside CI they
stay skips and expected failures. An unexpected pass of an ``xfail`` fails everywhere."""

from __future__ import annotations

import pytest

FILES = {
    "test_collected_skip": """
import pytest
pytest.importorskip("no_module_by_this_name")

def test_never_collected():
    pass
""",
    "test_outcomes": """
import pytest

def test_passes():
    pass

def test_skips():
    pytest.skip("no slurm binaries here")

@pytest.mark.xfail(reason="a known bug")
def test_fails_as_expected():
    assert False
""",
}
HOOKS = "from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401\n"


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(HOOKS)
    pytester.makepyfile(**FILES)
    return pytester


def test_in_ci_every_skip_and_expected_failure_fails_naming_why(suite: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest_inprocess("-p", "no:cacheprovider", "--continue-on-collection-errors", "-rfE")
    result.assert_outcomes(passed=1, failed=2, errors=1)
    out = result.stdout.str()
    assert "skipped in CI while collected, which must run it" in out and "no_module_by_this_name" in out
    assert "skipped in CI, which must run it: Skipped: no slurm binaries here" in out
    assert "marked xfail, and CI runs no test that is expected to fail: a known bug" in out
    plain = suite.runpytest_inprocess("-p", "no:cacheprovider")  # a collection error stops the run
    assert plain.ret != 0


def test_outside_ci_they_stay_skips_and_expected_failures(suite: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = suite.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    assert result.ret == 0


def test_an_unexpected_pass_of_an_xfail_fails(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.getini("xfail_strict") is True
