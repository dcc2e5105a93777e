"""Shared fixtures for the protocol tests: a checker for refusals (status, code and param exactly)."""

from __future__ import annotations

import pytest

from spinf.errors import ApiError


@pytest.fixture
def refused():
    """``refused(call, code, param)``: ``call()`` must raise a 400 `ApiError` with exactly that code and param."""

    def check(call, code: str, param: str | None) -> ApiError:
        with pytest.raises(ApiError) as info:
            call()
        error = info.value
        assert (error.status, error.code, error.param) == (400, code, param), error.message
        return error

    return check
