# ruff: noqa: F821 - `args` is bound by the sandbox before this program runs
# The `calculator` tool (configs/jobs/agent_calc.yaml): evaluates `args['expression']`, arithmetic on
# numbers with + - * / // % ** and parentheses, and prints its value. Anything else is refused with a
# message the model reads. It runs in the episode's sandbox, so even a bad expression harms nothing.
import ast
import operator

OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def value(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        if isinstance(node.op, ast.Pow) and abs(value(node.right)) > 64:
            raise ValueError("exponent too large")
        return OPS[type(node.op)](value(node.left), value(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        return OPS[type(node.op)](value(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


expression = str(args["expression"]).replace("×", "*").replace("÷", "/").replace("^", "**")
try:
    result = value(ast.parse(expression, mode="eval").body)
except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as err:
    raise SystemExit(f"cannot evaluate {expression!r}: {err}") from None
print(int(result) if isinstance(result, float) and result.is_integer() else result)
