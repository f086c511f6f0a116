"""A test harness for workflows: the real engine in memory, with time skipping (docs/testing.md).

from processors.testing import WorkflowEnvironment

def test_greets() -> None:
    with WorkflowEnvironment("definitions/", actions={"greet": lambda ctx, input: {"hi": input["name"]}}) as env:
        result = env.run("hello", {"name": "Ada"})
        result.assert_succeeded()
        assert result.output == {"hi": "Ada"}
"""

from processors.testing.environment import SignalsNotSent, Stuck, TestRun, WorkflowEnvironment
from processors.testing.results import RunResult
from processors.testing.workers import NO_ANSWER

__all__ = ["NO_ANSWER", "RunResult", "SignalsNotSent", "Stuck", "TestRun", "WorkflowEnvironment"]
