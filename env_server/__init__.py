"""Tool environments: the base class and ``@tool``, the registry, the FastAPI service and clients.

The public surface for environment authors::

    from env_server import Message, RewardResult, ToolEnvironment, register_environment, tool

``ToolCall`` is the record of one call (``pqrl.tool_calls``); ``ToolCallRequest`` is its HTTP body.
"""

from env_server.environment import ToolEnvironment
from env_server.registry import register_environment
from env_server.tools import tool
from env_server.types import (
    Message,
    Observation,
    RewardResult,
    StepResult,
    ToolCall,
    ToolCallRequest,
    ToolStatus,
)

__all__ = [
    "Message",
    "Observation",
    "RewardResult",
    "StepResult",
    "ToolCall",
    "ToolCallRequest",
    "ToolEnvironment",
    "ToolStatus",
    "register_environment",
    "tool",
]
