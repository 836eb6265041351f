"""The one classification table every rollout path uses: which failures stop the job, which give up
one task, which are waited out, which are retried."""

from __future__ import annotations

import pytest

from engine.errors import EngineHTTPError, EngineRequestFailed, EngineUnavailable
from env_server.client import AuthError, EnvUnavailable, InvalidReply
from env_server.sessions import (
    BackendDown,
    BadTask,
    EnvironmentBroken,
    GraderFailure,
    InfraFailure,
    InvalidRequest,
    NotFound,
    TooManySessions,
    UnknownEnv,
)
from pqrl import faults
from pqrl.faults import Fault, classify, fault_of, fix_for
from tasks.coding.grader import GoldReferenceError


@pytest.mark.parametrize(
    ("status", "code", "fault"),
    [
        (401, "unauthorized", Fault.JOB), (403, "unauthorized", Fault.JOB), (403, "", Fault.JOB),
        (404, "unknown_environment", Fault.JOB), (404, "engine_not_found", Fault.JOB),
        (404, "not_found", Fault.TRANSIENT),  # a session lost with a restarted server
        (422, "bad_task", Fault.TASK), (422, "invalid_request", Fault.TASK), (400, "", Fault.TASK),
        (409, "session_done", Fault.TASK), (413, "", Fault.TASK),
        (503, "sandbox_backend_down", Fault.OUTAGE),
        (408, "", Fault.TRANSIENT), (429, "too_many_sessions", Fault.TRANSIENT),
        (500, "environment_error", Fault.TRANSIENT), (500, "grader_failure", Fault.TRANSIENT),
        (502, "infra_failure", Fault.TRANSIENT), (503, "", Fault.TRANSIENT), (504, "", Fault.TRANSIENT),
        (None, "", Fault.TRANSIENT),
    ],
)  # fmt: skip
def test_the_table(status, code, fault):
    assert classify(status, code) is fault


def test_a_known_code_outranks_its_status():
    assert classify(500, "bad_task") is Fault.TASK and classify(200, "unauthorized") is Fault.JOB


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (AuthError("x"), Fault.JOB), (UnknownEnv("x"), Fault.JOB),
        (EngineHTTPError("u", 401, ""), Fault.JOB), (EngineHTTPError("u", 404, ""), Fault.JOB),
        (BadTask("x"), Fault.TASK), (InvalidRequest("x"), Fault.TASK),
        (GoldReferenceError("gold fails"), Fault.TASK), (faults.BadTask("x"), Fault.TASK),
        (EngineHTTPError("u", 422, ""), Fault.TASK),
        (BackendDown("x"), Fault.OUTAGE),
        (NotFound("x"), Fault.TRANSIENT), (TooManySessions("x"), Fault.TRANSIENT),
        (EnvironmentBroken("x"), Fault.TRANSIENT), (GraderFailure("x"), Fault.TRANSIENT),
        (InfraFailure("x"), Fault.TRANSIENT), (InvalidReply("x"), Fault.TRANSIENT),
        (EnvUnavailable("x"), Fault.TRANSIENT), (EngineHTTPError("u", 500, ""), Fault.TRANSIENT),
        (EngineUnavailable("x"), Fault.TRANSIENT), (EngineRequestFailed("x"), Fault.TRANSIENT),
        (ConnectionResetError(), Fault.TRANSIENT), (ValueError("x"), Fault.TRANSIENT),
    ],
)  # fmt: skip
def test_every_error_of_the_clients_has_its_class(error, fault):
    assert fault_of(error) is fault


def test_an_auth_error_the_client_re_statused_stays_job_wide():
    e = AuthError("http://s: 403 invalid token")
    e.status = 403
    assert fault_of(e) is Fault.JOB and "token" in fix_for(e)


def test_every_permanent_class_says_what_to_fix():
    for e in (AuthError("x"), UnknownEnv("x"), BadTask("x"), BackendDown("x"), EngineHTTPError("u", 404, "")):
        assert fix_for(e), e
    assert "DOCKER_HOST" in fix_for(BackendDown("x"))
    assert fix_for(InfraFailure("x")) == ""
