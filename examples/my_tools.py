"""A worked example of a GRPO tool: copy this file and edit.

    python launch.py experiment=cpu_qwen3_tiny_grpo data.files=<prompt rows> \\
        'grpo.tools=[examples.my_tools.calculator]' 'grpo.rewards=[qwen3_neuron.rewards.exact_answer]'

A tool is a plain function the model calls by name between its turns. Its JSON schema, which the
chat template writes into the prompt, comes from its type hints and docstring (transformers'
`get_json_schema`, as TRL's): give every argument a type hint and an `Args:` line. It returns
what the model reads back (as `str()` gives it); an exception it raises is read back as
`{'error': '...'}`, so raise with a message the model can act on. It runs in a process of its own
and is stopped after `grpo.tool_timeout_s` seconds.
"""

from __future__ import annotations

import ast
import operator

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg}  # fmt: skip


def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression of numbers, + - * / // % and parentheses.

    Args:
        expression: The expression, e.g. "12 * (3 + 4)".
    """
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    return str(int(value) if isinstance(value, float) and value.is_integer() else value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"only numbers, + - * / // % and parentheses are allowed, not {ast.unparse(node)!r}")
