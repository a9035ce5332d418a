"""Not collected by `make test` (no test_ prefix): test_required_suites runs it on its own, to see
that a required suite skipped for want of a dependency fails the session."""

import pytest


def test_a_suite_whose_dependency_is_missing():
    pytest.skip("could not import 'ray': No module named 'ray'")


def test_a_skip_for_another_reason():
    pytest.skip("needs two GPUs")
